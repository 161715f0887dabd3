/* Placeholder: being written. */
typedef int metrics_placeholder;
