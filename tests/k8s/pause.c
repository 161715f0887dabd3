/* The pod sandbox's only process (the cluster's "pause" image): it holds the
 * pod's namespaces, reaps the zombies of a shared PID namespace, and exits on
 * SIGTERM or SIGINT so a pod stops at once. Built static by cluster.sh. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  _exit(sig == SIGTERM ? 0 : 2);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  signal(SIGTERM, on_stop);
  signal(SIGINT, on_stop);
  signal(SIGCHLD, on_child);
  for (;;) pause();
}
