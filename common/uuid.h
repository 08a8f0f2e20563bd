/* Device UUIDs: 16 bytes, printed the way nvidia-smi prints them
 * ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"), with "HOST-" for devices of
 * the host backend. Thread-safe. */
#ifndef GRAPHD_COMMON_UUID_H
#define GRAPHD_COMMON_UUID_H

#include <stddef.h>
#include <stdint.h>

#define GD_UUID_STR_MAX 48

/* Formats uuid with the given prefix ("GPU-" or "HOST-"). */
void gd_uuid_format(const uint8_t uuid[16], const char *prefix, char out[GD_UUID_STR_MAX]);

/* Parses "GPU-…", "HOST-…", "MIG-…" or a bare 32-hex-digit form, dashes
 * optional. Returns 0 or -1. */
int gd_uuid_parse(const char *s, uint8_t uuid[16]);

#endif
