"""Optional features, each behind its flag and imported only when asked: off the RL path a learner reads."""
