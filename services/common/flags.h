/*
 * flags: the one command-line parser of every Stoker program (the daemons,
 * stokerctl, stoker-train). A program describes each flag once, as a row
 * naming its type, where it is stored (offsetof in the program's own
 * struct), its default, bounds and help; from that table come parsing,
 * bounds checks, error lines and help text. config.c layers a config file
 * and the environment on top of the same rows for the daemons.
 *
 * Command line syntax:
 *   --name value, --name=value; a bool also as --name (true) and --no-name
 *   (false), and takes a value only with '='; "--help" / "-h" and
 *   "--version" are always known; "--" ends the flags (the words after it
 *   are positional).
 *
 * Value syntax per type (field type in the caller's struct in brackets):
 *   FLAG_STRING    any text, copied            [char *, malloc'd; flag_free]
 *   FLAG_ARG       any text, not copied        [const char *, into argv]
 *   FLAG_BOOL      true/false, yes/no, on/off, 1/0  [bool]
 *   FLAG_INT       decimal integer             [int]
 *   FLAG_INT64     decimal integer             [int64_t]
 *   FLAG_UINT64    decimal integer >= 0        [uint64_t]
 *   FLAG_FLOAT     decimal number (strtod)     [float]
 *   FLAG_DURATION  500ms, 5s, 2m, 1h, 1d, sums like 1m30s, fractions like
 *                  1.5s, or 0                  [int64_t milliseconds]
 *   FLAG_SIZE      4096, 512B, 64KiB, 16MiB, 1GiB, 1TiB (K/M/G/T the same;
 *                  KB/MB/GB/TB are powers of 1000)  [uint64_t bytes]
 *   FLAG_ENUM      one of enum_names           [int: index in enum_names]
 * Numeric rows are checked against [min, max] unless both are 0. A number
 * is whole: "10x", "" and overflow are refused.
 *
 * Errors are one line naming the flag (or the source given as where):
 *   "unknown flag --stepz (see --help)", "--port: missing value",
 *   "--port: expected an integer, got '12x'",
 *   "--port: 70000 is out of range [1, 65535]".
 * Not thread-safe; call from main() before starting threads.
 */
#ifndef STK_FLAGS_H
#define STK_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "strbuf.h"

enum flag_type {
  FLAG_STRING,
  FLAG_BOOL,
  FLAG_INT64,
  FLAG_UINT64,
  FLAG_DURATION, /* Stored as int64_t milliseconds. */
  FLAG_SIZE,     /* Stored as uint64_t bytes. */
  FLAG_ENUM,     /* Stored as int. */
  FLAG_INT,      /* Stored as int. */
  FLAG_FLOAT,    /* Stored as float. */
  FLAG_ARG,      /* Stored as const char *, pointing at the given text. */
};

/* Row flags. */
#define FLAG_SECRET 1u /* Never printed: effective values show "(set)". */
/* A FLAG_STRING that may be given several times: each occurrence within
 * one source adds to the list (stored joined by ':', as PATH is). */
#define FLAG_REPEAT 2u
/* Not stored in a field: each occurrence is recorded, in order, in
 * flag_rest.listed (a FLAG_BOOL row records a NULL value and takes no
 * "=value"). For flags whose meaning depends on what else is on the line
 * (stokerctl's verb flags). */
#define FLAG_LISTED 4u

struct flag_spec {
  const char *name; /* "heartbeat-interval": the flag without dashes. */
  enum flag_type type;
  size_t offset;    /* offsetof(struct program_options, field). */
  const char *def;  /* Default as text; NULL: "" / 0 / first enum name. FLAG_LISTED rows:
                     * what applies when absent, shown by help only (NULL: none shown). */
  int64_t min, max; /* Inclusive bounds; both 0: none. */
  const char *const *enum_names; /* FLAG_ENUM: NULL-terminated names. */
  const char *help;              /* One sentence (may hold '\n'). */
  unsigned flags;                /* FLAG_SECRET, FLAG_REPEAT, FLAG_LISTED. */
};

struct flag_table {
  const char *program; /* "stoker-train": prefixes usage. */
  const char *usage;   /* After the program in the usage line; NULL: "[--OPTION VALUE]...". */
  const struct flag_spec *specs;
  size_t n_specs;
  const char *summary; /* One line shown by help; may be NULL. */
};

/* One FLAG_LISTED occurrence. */
struct flag_occurrence {
  const char *name;  /* The row's name. */
  const char *value; /* Into argv; NULL for a bool row. */
};

/* What a command line holds besides stored flags. Set pos (and max_pos)
 * to accept positional words, listed (and max_listed) for FLAG_LISTED rows;
 * left NULL, a positional word is an error. */
struct flag_rest {
  bool help;    /* --help or -h seen. */
  bool version; /* --version seen. */
  const char **pos;
  int n_pos, max_pos;
  struct flag_occurrence *listed;
  int n_listed, max_listed;
};

/* The row named name[0..len), or NULL. */
const struct flag_spec *flag_find(const struct flag_table *t, const char *name, size_t len);

/* Checks a table for empty, duplicated or malformed rows; 0 or STK_EINVAL
 * with the row named in err. */
int flag_check_table(const struct flag_table *t, char *err, size_t err_len);

/* Stores every row's default (FLAG_STRING fields are set to NULL first, so
 * flag_free works on any return). Returns 0 or STK_EINVAL / STK_ENOMEM. */
int flag_defaults(const struct flag_table *t, void *dst, char *err, size_t err_len);

/* Parses text for row s and stores it in dst; a bad value stores nothing.
 * where names the source in errors ("--port", "FILE:3: port"). With append
 * (a FLAG_REPEAT row already given in the same source) the text is joined
 * to the field's value with ':'. Returns 0, STK_EINVAL or STK_ENOMEM. */
int flag_set(const struct flag_spec *s, void *dst, const char *text, const char *where, bool append,
             char *err, size_t err_len);

/* Parses argv[1..argc-1] into dst (defaults are not applied: call
 * flag_defaults first). rest may be NULL: then a positional word is an
 * error and --help / --version are skipped (the caller looked for them).
 * Returns 0, or STK_EINVAL / STK_ENOMEM with one line in err; on error dst
 * may hold the flags before the bad one. */
int flag_parse(const struct flag_table *t, void *dst, int argc, char **argv, struct flag_rest *rest,
               char *err, size_t err_len);

/* Frees dst's FLAG_STRING fields and sets them to NULL. */
void flag_free(const struct flag_table *t, void *dst);

/* The number parsers the rows use, for programs that read numbers from
 * elsewhere (operands): 0, STK_EINVAL (not a whole number) or STK_ERANGE
 * (over max). */
int flag_parse_uint(const char *s, uint64_t max, uint64_t *ret_value);
int flag_parse_duration_ms(const char *s, int64_t *ret_ms);

/* Help for one row: "  --name PLACEHOLDER\n      help\n      (facts)\n"
 * (a stored bool shows "| --no-name", a FLAG_LISTED one nothing). env, when
 * not NULL, is named among the facts. */
void flag_put_help(const struct flag_spec *s, const char *env, struct strbuf *sb);

/* "type, default X, range [a, b]" (and ", env NAME" when env). */
void flag_put_facts(const struct flag_spec *s, const char *env, struct strbuf *sb);

/* A value as a config file writes it: quoted when it would not survive
 * trimming and comment stripping as is. */
void flag_put_quoted(struct strbuf *sb, const char *v);

/* The field's value in the row's own syntax (5s, 64MiB, bf16). */
void flag_put_value(const struct flag_spec *s, const void *src, struct strbuf *sb);

/* The row's default text (def, or what NULL stands for). */
const char *flag_default_text(const struct flag_spec *s);

/* Help text with each newline followed by newline_prefix. */
void flag_put_indented(struct strbuf *sb, const char *text, const char *newline_prefix);

/* "Usage: PROGRAM USAGE\nSUMMARY\n\n" then every row's help, to out. */
void flag_print_help(const struct flag_table *t, FILE *out);

#endif
