/*
 * config: table-driven daemon configuration (in the manner of Redis's
 * config table). A daemon describes each option once, as a row naming its
 * type, bounds, default and help, and where it lives in the daemon's own
 * config struct (offsetof). From that one table come parsing, validation,
 * layering, --help, the effective-config log line and the annotated example
 * config file shipped in deploy/.
 *
 * Layering, each source overriding the previous one:
 *   1. defaults (the def text of each row, parsed like any other value);
 *   2. the config file named by --config FILE (or STOKER_<PREFIX>_CONFIG):
 *      lines "name = value", '#' starts a comment (a whole line, or after
 *      whitespace), blank lines ignored, a value may be "double quoted";
 *      unknown names and bad values are errors naming FILE:LINE;
 *   3. environment: STOKER_<PREFIX>_<NAME>, the name upper-cased with '-'
 *      turned into '_' (STOKER_COORDINATOR_LISTEN);
 *   4. flags, parsed by flags.c: --name value, --name=value; bools also as
 *      --name (true) and --no-name (false).
 *
 * The rows are struct flag_spec (flags.h), which gives the value syntax of
 * each type. A FLAG_REPEAT row given several times within the config file,
 * or within the flags, gets each value appended (':'-joined, as PATH is;
 * its environment variable is such a list); a later layer replaces what
 * earlier layers gave.
 *
 * Errors are one line in the caller's buffer, naming where the value came
 * from: "--heartbeat-interval: expected a duration like 5s, got 'abc'".
 * Not thread-safe; call from main() before starting threads.
 */
#ifndef STK_CONFIG_H
#define STK_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "flags.h"

struct cfg_table {
  const char *program;    /* "stoker-coordinator" */
  const char *env_prefix; /* "COORDINATOR": STOKER_COORDINATOR_*; NULL: STOKER_* */
  const struct flag_spec *opts;
  size_t n_opts;
  const char *summary; /* One line shown by --help. */
};

/* Fills dst from the layers above (argv[0] is the program and skipped).
 * Returns 0 when loaded, 1 when --help or --version was given (help, or
 * "PROGRAM VERSION" with STK_VERSION, printed to stdout; the caller should
 * exit 0), or a negative STK_E* code with one line in
 * err. On every return the string fields of dst are valid (or NULL) and
 * must be released with cfg_free; dst's other fields need no init. */
int cfg_load(const struct cfg_table *t, void *dst, int argc, char **argv, char *err,
             size_t err_len);

/* Frees dst's strings and sets them to NULL. */
void cfg_free(const struct cfg_table *t, void *dst);

/* Sets one option from text, as if given as a flag (for tests and for
 * daemons that compute a value). where names the source in errors. */
int cfg_set(const struct cfg_table *t, void *dst, const char *name, const char *value,
            const char *where, char *err, size_t err_len);

/* The environment variable for an option: "STOKER_COORDINATOR_LISTEN". */
void cfg_env_name(const struct cfg_table *t, const struct flag_spec *o, char *out, size_t out_len);

/* Usage, summary, and every option with its type, default, bounds or
 * choices, environment variable and help. */
void cfg_print_help(const struct cfg_table *t, FILE *out);

/* The effective value of every option as "name = value" lines, the same
 * syntax a config file takes (secrets shown as "(set)" or ""). */
void cfg_print_effective(const struct cfg_table *t, const void *src, FILE *out);

/* Logs the effective config at info, one line: event "config", message
 * "name=value name=value ..." (secrets hidden). */
void cfg_log_effective(const struct cfg_table *t, const void *src);

/* An annotated example config file: for every option its help, type,
 * environment variable as comments, then "name = default". Loading it back
 * gives the defaults. Returns 0 or STK_EIO if writing failed. */
int cfg_write_example(const struct cfg_table *t, FILE *out);

#endif
