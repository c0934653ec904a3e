"""The `fa-variants` sub-commands that are not user-facing modules of their own (kept apart from the
kernel folders): `compile` (compile-only report) and `bench_fa3` (the FA3 GPU-host benchmark)."""
