"""Where kernels run and are timed: a real GPU (cuda) or Triton's CPU interpreter."""
