"""Alert rules: pure evaluation of samples, no I/O."""
