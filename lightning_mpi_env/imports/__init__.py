"""The mixed-import guard: where each Lightning namespace came from, and objects built on the other one."""
