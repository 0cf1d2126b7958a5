/*
 * Error codes shared by every layer and by the public client ABI.
 *
 * APS_ERR_MAP is the one list: it generates enum aps_err here and the
 * message table in err.c. Codes are negative, stable and never renumbered;
 * the public header worker/aps.h includes this file as it is.
 */
#ifndef APS_COMMON_ERR_H
#define APS_COMMON_ERR_H

#define APS_ERR_MAP(X)                                         \
	X(EINVAL, -1, "invalid argument")                      \
	X(ENOMEM, -2, "out of memory")                         \
	X(EFORMAT, -3, "unknown or unsupported number format") \
	X(ERANGE, -4, "value out of range")                    \
	X(ESHORT, -5, "buffer too short")                      \
	X(ENONFINITE, -6, "tensor holds NaN or infinity")      \
	X(EPROTO, -7, "protocol error")                        \
	X(ETIMEDOUT, -8, "timed out")                          \
	X(EPEERLOST, -9, "a peer rank was lost")               \
	X(ECONN, -10, "connection failed")                     \
	X(ECLOSED, -11, "client is closed")                    \
	X(EMISMATCH, -12, "ranks disagree")                    \
	X(EBUSY, -13, "resource busy")                         \
	X(ESYS, -14, "system call failed")                     \
	X(ECONFIG, -15, "bad configuration")                   \
	X(ENOSESSION, -16, "apsd does not know this session")  \
	X(EACCES, -17, "not allowed")

enum aps_err {
	APS_OK = 0,
#define APS_ERR_ENUM(name, value, text) APS_##name = (value),
	APS_ERR_MAP(APS_ERR_ENUM)
#undef APS_ERR_ENUM
};

/** Returns a static English message for an APS_E* code (or "unknown error"). */
const char *aps_strerror(int code);

/** Returns the symbolic name of an APS_E* code ("APS_EINVAL"), or NULL. */
const char *aps_err_name(int code);

#endif
