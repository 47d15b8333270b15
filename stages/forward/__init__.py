"""Forward metadata: the step a scheduler planned, as the tensors and static shapes a forward
pass takes.

metadata (the builder), forward_meta (its value), prefill_part (the prefill rectangle),
step_shape; buckets, bucket_axes, bucket_planner, engine_grids and cudagraph (the warmed-up
shapes a step pads to, and each engine's grid); host_tensor.
"""
