/* Placeholder: being written. */
typedef int rpc_security_placeholder;
