/* Placeholder: being written. */
typedef int log_placeholder;
