#include <stddef.h>
size_t cudnnGetVersion(void) { return 90100; }
