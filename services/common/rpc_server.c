/* Placeholder: being written. */
typedef int rpc_server_placeholder;
