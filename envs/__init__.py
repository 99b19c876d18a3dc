"""MiniWob++ in a headless Chromium: the environment (miniwob_env.py) and its scripted experts, the
built-in policies and the command line (miniwob_experts.py, which imports miniwob_env, never the reverse);
the task pages, the package's and the project's own (miniwob_tasks.py, imported by both)."""
