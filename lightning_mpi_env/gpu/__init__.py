"""Which GPU each rank drives, and what torch's NCCL backends need to know of it; the standard library and ``core/``."""
