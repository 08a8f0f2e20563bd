/* The status list's string tables, generated from GRAPHD_STATUS_LIST. */
#include "graphd/status.h"

static int positive(int s) { return s < 0 ? -s : s; }

const char *graphd_strerror(int status) {
  switch (positive(status)) {
#define GRAPHD_STATUS_DESC_(name, value, desc)                                                     \
  case value: return desc;
    GRAPHD_STATUS_LIST(GRAPHD_STATUS_DESC_)
#undef GRAPHD_STATUS_DESC_
  }
  return "unknown status";
}

const char *graphd_status_name(int status) {
  switch (positive(status)) {
#define GRAPHD_STATUS_NAME_(name, value, desc)                                                     \
  case value: return #name;
    GRAPHD_STATUS_LIST(GRAPHD_STATUS_NAME_)
#undef GRAPHD_STATUS_NAME_
  }
  return "UNKNOWN";
}

int graphd_status_valid(int status) {
  switch (status) {
#define GRAPHD_STATUS_VALID_(name, value, desc) case value:
    GRAPHD_STATUS_LIST(GRAPHD_STATUS_VALID_)
#undef GRAPHD_STATUS_VALID_
    return 1;
  }
  return 0;
}
