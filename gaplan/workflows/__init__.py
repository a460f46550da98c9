"""What each command does, as library calls (no printing, no exits): probe, train, bench, plan, token runs."""
