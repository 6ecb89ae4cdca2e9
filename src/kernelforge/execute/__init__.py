"""Running candidates: executors (in-process, sandboxed worker, replay), verification and the policy."""
