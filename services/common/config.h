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
 *   4. flags: --name value, --name=value; bools also as --name (true) and
 *      --no-name (false); a bool takes a value only with '='.
 *
 * Value syntax per type (field type in the caller's struct in brackets):
 *   CFG_STRING    any text                         [char *, malloc'd]
 *   CFG_BOOL      true/false, yes/no, on/off, 1/0  [bool]
 *   CFG_INT64     decimal integer                  [int64_t]
 *   CFG_UINT64    decimal integer >= 0             [uint64_t]
 *   CFG_DURATION  500ms, 5s, 2m, 1h, or 0          [int64_t milliseconds]
 *   CFG_SIZE      4096, 512B, 64KiB, 16MiB, 1GiB, 1TiB (K/M/G/T the same;
 *                 KB/MB/GB/TB are powers of 1000)  [uint64_t bytes]
 *   CFG_ENUM      one of enum_names                [int: index in enum_names]
 * Numeric rows are checked against [min, max] unless both are 0.
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

enum cfg_type {
  CFG_STRING,
  CFG_BOOL,
  CFG_INT64,
  CFG_UINT64,
  CFG_DURATION, /* Stored as int64_t milliseconds. */
  CFG_SIZE,     /* Stored as uint64_t bytes. */
  CFG_ENUM,     /* Stored as int. */
};

/* Option flags. */
#define CFG_SECRET 1u /* Never printed: the effective config shows "(set)". */
/* A CFG_STRING that may be given several times: within the config file, and
 * within the flags, each occurrence adds to the list (stored joined by ':',
 * as PATH is; its environment variable is such a list); a later layer
 * replaces what earlier layers gave. */
#define CFG_REPEAT 2u

struct cfg_option {
  const char *name; /* "heartbeat-interval": flag and file key. */
  enum cfg_type type;
  size_t offset;                 /* offsetof(struct daemon_config, field). */
  const char *def;               /* Default as text; NULL means "" / 0. */
  int64_t min, max;              /* Inclusive bounds; both 0: none. */
  const char *const *enum_names; /* CFG_ENUM: NULL-terminated names. */
  const char *help;              /* One sentence. */
  unsigned flags;                /* CFG_SECRET, CFG_REPEAT. */
};

struct cfg_table {
  const char *program;    /* "stoker-coordinator" */
  const char *env_prefix; /* "COORDINATOR": STOKER_COORDINATOR_*; NULL: STOKER_* */
  const struct cfg_option *opts;
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
void cfg_env_name(const struct cfg_table *t, const struct cfg_option *o, char *out, size_t out_len);

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
