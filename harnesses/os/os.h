/* Shared by the OS harness's tools. */
#ifndef OS_H
#define OS_H

#include "berm.h"

/** Every tool's output is bounded by this; more is a failure saying so, never a silently partial result. */
#define OS_OUTPUT_LIMIT (256u << 10)

/** A required string argument that must not be empty (paths, patterns, commands). */
void os_arg_nonempty(berm_arg_set *a, const char *key, berm_str *out);

#endif
