/* Placeholder: being written. */
typedef int rpc_health_placeholder;
