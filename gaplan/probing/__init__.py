"""Finding the exact edge on the device: B* by real trials, T* for token budgets, and the probe cache."""
