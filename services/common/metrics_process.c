/*
 * metrics_process: the process_* series every Prometheus client library
 * exports (CPU time, memory, file descriptors, start time), read from
 * /proc at scrape time rather than sampled on a timer, so a scrape always
 * sees the current figures and an idle daemon does no work for them.
 * Linux only: where /proc is missing the series are left out.
 *
 * /proc/self/stat after the ")" that closes the command name (which may
 * hold spaces): field 3 is the state, 14 utime and 15 stime (clock ticks),
 * 22 starttime (ticks since boot), 23 vsize (bytes), 24 rss (pages).
 */
#include "metrics.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "strbuf.h"

struct proc_stat {
  double cpu_seconds;
  double start_ticks; /* Since boot. */
  double vsize_bytes;
  double rss_bytes;
};

static bool read_stat(struct proc_stat *ret) {
  char buf[2048];
  FILE *f = fopen("/proc/self/stat", "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (!p) return false;
  /* Fields from 3 on; index i here is field i + 3. */
  unsigned long long v[22] = {0};
  int i = 0;
  for (char *tok = strtok(p + 1, " \n"); tok && i < 22; tok = strtok(NULL, " \n"), i++)
    v[i] = strtoull(tok, NULL, 10);
  if (i < 22) return false;
  double tick = (double)sysconf(_SC_CLK_TCK);
  long page = sysconf(_SC_PAGESIZE);
  ret->cpu_seconds = (double)(v[14 - 3] + v[15 - 3]) / tick;
  ret->start_ticks = (double)v[22 - 3] / tick;
  ret->vsize_bytes = (double)v[23 - 3];
  ret->rss_bytes = (double)v[24 - 3] * (double)page;
  return true;
}

/* The boot time (btime in /proc/stat), in Unix seconds; 0 if unknown. */
static double boot_time(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return 0;
  char line[256];
  double btime = 0;
  while (fgets(line, sizeof(line), f))
    if (strncmp(line, "btime ", 6) == 0) btime = strtod(line + 6, NULL);
  fclose(f);
  return btime;
}

/* Entries of /proc/self/fd, less the one opendir holds; -1 if unreadable. */
static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1;
}

static void put(struct strbuf *sb, const char *name, const char *type, const char *help,
                double value) {
  strbuf_printf(sb, "# HELP %s %s\n# TYPE %s %s\n%s %.15g\n", name, help, name, type, name, value);
}

void metrics_process_collect(struct strbuf *sb, void *arg) {
  (void)arg;
  struct proc_stat st;
  if (read_stat(&st)) {
    put(sb, "process_cpu_seconds_total", "counter",
        "Total user and system CPU time spent in seconds.", st.cpu_seconds);
    put(sb, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
        st.rss_bytes);
    put(sb, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
        st.vsize_bytes);
    double btime = boot_time();
    if (btime > 0)
      put(sb, "process_start_time_seconds", "gauge",
          "Start time of the process since unix epoch in seconds.", btime + st.start_ticks);
  }
  int fds = open_fds();
  if (fds >= 0) put(sb, "process_open_fds", "gauge", "Number of open file descriptors.", fds);
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    put(sb, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
        (double)rl.rlim_cur);
}
