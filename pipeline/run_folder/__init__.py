"""A run folder: its files written as the run goes (artefacts, records), opened
safely (run_files), locked to one writer (folder_lock), read back checked (reader),
recorded (identity) and resumed (resume, former_names)."""
