"""A simulated device: hardware profiles, a step cost model (with expert parallelism and
precision), and the device stage that puts each step's predicted time on a clock."""
