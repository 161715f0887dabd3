/* Placeholder: being written. */
typedef int rpc_codes_placeholder;
