"""Fakes of hardware libraries for tests (NVML parsed from real nvidia-smi dumps)."""
