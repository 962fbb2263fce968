/* Shared by the OS harness's tools. */
#ifndef OS_H
#define OS_H

#include "berm.h"

/** What read shows at most: past it, the lines that fit and a footer saying where to go on from. */
#define OS_OUTPUT_LIMIT (256u << 10)
/** One line as read shows it at most; the rest is marked with how much was left out. */
#define OS_LINE_LIMIT 2000u
/** bash's and grep's results are bounded by the host (1 MiB per output stream, 1000 lines of 500 characters), which
 *  marks what it cut: this only has to hold them, JSON escapes included, below the engine's 16 MiB result cap. */
#define OS_REPLY_LIMIT (15u << 20)

/** A required string argument that must not be empty (paths, patterns, commands). */
void os_arg_nonempty(berm_arg_set *a, const char *key, berm_str *out);

#endif
