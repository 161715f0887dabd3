/*
 * The standard gRPC health check (grpc.health.v1.Health/Check), the one
 * probe every Stoker daemon answers, exempt from bearer tokens: one unary
 * call through client_call(), the status handed out as the public enum
 * stk_serving_status (same numbers as the proto's ServingStatus).
 */
#include "client_internal.h"

_Static_assert(
    (int)STK_SERVING == (int)GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING &&
        (int)STK_NOT_SERVING ==
            (int)GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING &&
        (int)STK_SERVICE_UNKNOWN ==
            (int)GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN,
    "enum stk_serving_status is grpc.health.v1's ServingStatus");

int stk_health_check(struct stk_client *c, const char *service, int64_t timeout_ms,
                     int *ret_status) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)(service ? service : "");
  Grpc__Health__V1__HealthCheckResponse *resp = NULL;
  int err = CLIENT_CALL(grpc__health__v1__health, c, check, &req, timeout_ms, &resp);
  if (err < 0) return err;
  *ret_status = resp->status;
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return 0;
}
