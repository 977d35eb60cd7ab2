/* The header that cuda-sys's bindings are generated from. */
#include <cuda.h>
