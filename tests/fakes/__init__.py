"""Fakes of hardware for tests: NVML parsed from real nvidia-smi dumps, CPU topologies we lack."""
