"""Several ranks: the process group, FSDP2 sharding, building a sharded workload, gathering its state."""
