"""Running one job: serving a composed config into its run folder (run, serving), the
step loop (engine), its clock, the signals and hook that stop it (signals, stop_hook),
and what it measures and shows (metrics, slo, console)."""
