int b_value(void) { return 42; }
