/*
 * net_owner: which process listens on a TCP port, so "port 7070 is in use"
 * can go on "by process 1234 (stoker-coordinator)". Linux only, and best
 * effort: the listening socket's inode comes from /proc/net/tcp and tcp6
 * (state 0A, LISTEN), its owner from the /proc/PID/fd links that name
 * "socket:[INODE]"; processes of other users are not readable (unless
 * root), and then the owner stays unknown.
 */
#include "net_listen.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The inode of a socket listening on port, from one /proc/net table. */
static unsigned long listening_inode(const char *table, int port) {
  FILE *f = fopen(table, "r");
  if (!f) return 0;
  char line[512];
  unsigned long inode = 0;
  while (!inode && fgets(line, sizeof(line), f)) {
    char local[80], state[8];
    unsigned long ino;
    /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
    if (sscanf(line, " %*s %79s %*s %7s %*s %*s %*s %*s %*s %lu", local, state, &ino) != 3)
      continue;
    const char *colon = strrchr(local, ':');
    if (colon && strcmp(state, "0A") == 0 && strtol(colon + 1, NULL, 16) == port) inode = ino;
  }
  fclose(f);
  return inode;
}

/* True when one of pid's descriptors is the socket named want. */
static bool holds(int pid, const char *want) {
  char dir[64];
  snprintf(dir, sizeof(dir), "/proc/%d/fd", pid);
  DIR *d = opendir(dir);
  if (!d) return false;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(d));) {
    char path[384], target[64];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    if (n > 0) {
      target[n] = '\0';
      found = strcmp(target, want) == 0;
    }
  }
  closedir(d);
  return found;
}

int net_listen_owner(int port, char *ret_name, size_t name_len) {
  unsigned long inode = listening_inode("/proc/net/tcp", port);
  if (!inode) inode = listening_inode("/proc/net/tcp6", port);
  if (!inode) return 0;
  char want[64];
  snprintf(want, sizeof(want), "socket:[%lu]", inode);
  DIR *d = opendir("/proc");
  int owner = 0;
  for (struct dirent *e; d && !owner && (e = readdir(d));) {
    int pid = e->d_name[0] >= '1' && e->d_name[0] <= '9' ? atoi(e->d_name) : 0;
    if (pid <= 0 || !holds(pid, want)) continue;
    owner = pid;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/comm", pid);
    FILE *f = fopen(path, "r");
    if (ret_name && name_len) ret_name[0] = '\0';
    if (f && ret_name && name_len && fgets(ret_name, (int)name_len, f))
      ret_name[strcspn(ret_name, "\n")] = '\0';
    if (f) fclose(f);
  }
  if (d) closedir(d);
  return owner;
}
