"""The composed config beyond its schema (pipeline.schema): composed in-process
(compose), checked across fields (checks), bounded in size (expansion), its layout,
the model it describes (describe), and what the engine and checkpoint allow
(engine_profile, checkpoint_rules)."""
