"""The kernel families: one folder (or module) an op family, each with its Triton kernels and
the host code that checks, plans and launches them. The public functions are re-exported by
``triton_workshop``."""
