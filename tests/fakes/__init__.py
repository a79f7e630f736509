"""Test doubles of hardware boundaries (NVML) and small helpers to read Kafka back."""
