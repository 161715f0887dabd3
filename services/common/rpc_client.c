/* Placeholder: being written. */
typedef int rpc_client_placeholder;
