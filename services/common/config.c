/* Placeholder: being written. */
typedef int config_placeholder;
