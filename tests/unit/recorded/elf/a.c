int b_value(void);
int a_value(void) { return b_value() + 1; }
