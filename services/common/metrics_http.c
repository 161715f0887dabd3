/* Placeholder: being written. */
typedef int metrics_http_placeholder;
