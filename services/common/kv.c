/* Placeholder: being written. */
typedef int kv_placeholder;
