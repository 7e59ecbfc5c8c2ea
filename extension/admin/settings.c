/*
 * admin/settings.c: the slipstream.* settings (GUCs), defined from two tables: the engine's
 * (engine/include/slipstream/engine/settings.def) and the extension's own (settings.def here),
 * and the engine options made of them.
 */
#include "slipstream.h"
#include "replication/repl.h"
#include "shuffle/shuffle.h"

#include "miscadmin.h"
#include "utils/guc.h"

/* What each table column means for a GUC. */
#define SS_GUC_CONTEXT_FIXED PGC_POSTMASTER
#define SS_GUC_CONTEXT_RELOAD PGC_SIGHUP
#define SS_GUC_CONTEXT_USER PGC_USERSET
#define SS_GUC_UNIT_NONE 0
#define SS_GUC_UNIT_BYTE GUC_UNIT_BYTE
#define SS_GUC_UNIT_KB GUC_UNIT_KB
#define SS_GUC_UNIT_MB GUC_UNIT_MB
#define SS_GUC_UNIT_MS GUC_UNIT_MS

/* Defines one GUC of a table line, by the line's KIND. */
#define SS_DEFINE_GUC_INT(NAME, VAR, DEFAULT, MIN, MAX, CONTEXT, UNIT, DESC, LONG_DESC) \
	DefineCustomIntVariable("slipstream." NAME, DESC, LONG_DESC, &(VAR), DEFAULT, MIN, MAX, \
							SS_GUC_CONTEXT_##CONTEXT, SS_GUC_UNIT_##UNIT, NULL, NULL, NULL)
#define SS_DEFINE_GUC_U32 SS_DEFINE_GUC_INT
#define SS_DEFINE_GUC_U64 SS_DEFINE_GUC_INT
#define SS_DEFINE_GUC_BOOL(NAME, VAR, DEFAULT, MIN, MAX, CONTEXT, UNIT, DESC, LONG_DESC) \
	DefineCustomBoolVariable("slipstream." NAME, DESC, LONG_DESC, &(VAR), DEFAULT, \
							 SS_GUC_CONTEXT_##CONTEXT, SS_GUC_UNIT_##UNIT, NULL, NULL, NULL)
#define SS_DEFINE_GUC_REAL(NAME, VAR, DEFAULT, MIN, MAX, CONTEXT, UNIT, DESC, LONG_DESC) \
	DefineCustomRealVariable("slipstream." NAME, DESC, LONG_DESC, &(VAR), DEFAULT, MIN, MAX, \
							 SS_GUC_CONTEXT_##CONTEXT, SS_GUC_UNIT_##UNIT, NULL, NULL, NULL)

/* The engine settings' GUC variables, in the table's units (kB, MB, ...). */
#define SS_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION) \
	static SS_GUC_CTYPE_##KIND guc_##FIELD = DEFAULT;
#define SS_SETTING_HOST(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, HOST_DEFAULT, HOST_MIN, \
						HOST_MAX, CONTEXT, DESCRIPTION) \
	static SS_GUC_CTYPE_##KIND guc_##FIELD = HOST_DEFAULT;
#include "slipstream/engine/settings.def"

/* The extension's own settings' variables (declared in slipstream.h). */
#define SS_EXT_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION, \
					   LONG_DESCRIPTION) \
	SS_GUC_CTYPE_##KIND ss_##FIELD = DEFAULT;
#include "admin/settings.def"

/* Defines every slipstream.* GUC and checks what no single range can (from _PG_init). */
void
ss_define_settings(void)
{
	uint64		device_bytes;
	uint64		segment_bytes;

#define SS_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION) \
	SS_DEFINE_GUC_##KIND(NAME, guc_##FIELD, DEFAULT, MIN, MAX, CONTEXT, UNIT, DESCRIPTION, NULL);
#define SS_SETTING_HOST(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, HOST_DEFAULT, HOST_MIN, \
						HOST_MAX, CONTEXT, DESCRIPTION) \
	SS_DEFINE_GUC_##KIND(NAME, guc_##FIELD, HOST_DEFAULT, HOST_MIN, HOST_MAX, CONTEXT, UNIT, \
						 DESCRIPTION, NULL);
#include "slipstream/engine/settings.def"
#define SS_EXT_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION, \
					   LONG_DESCRIPTION) \
	SS_DEFINE_GUC_##KIND(NAME, ss_##FIELD, DEFAULT, MIN, MAX, CONTEXT, UNIT, DESCRIPTION, \
						 LONG_DESCRIPTION);
#include "admin/settings.def"
	ss_repl_define_settings();
	ss_shuffle_define_settings();
	/* Last: placeholders of names not defined by now are dropped, with a warning. */
	MarkGUCPrefixReserved("slipstream");

	if (guc_small_threshold >= guc_large_threshold)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("slipstream.small_threshold (%d) must be below slipstream.large_threshold (%d)",
						guc_small_threshold, guc_large_threshold)));
	/* The engine's unit of allocation: a device size between two segments could not be used. */
	device_bytes = (uint64) ss_max_device_size_mb << 20;
	segment_bytes = (uint64) guc_segment_size << 10;
	if (device_bytes % segment_bytes != 0 || device_bytes / segment_bytes < 16)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("slipstream.max_device_size (%d MB) must be a multiple of "
						"slipstream.segment_size (%d kB), and at least 16 segments",
						ss_max_device_size_mb, guc_segment_size),
				 errhint("Set slipstream.max_device_size to a multiple of slipstream.segment_size.")));
}

/* The engine options from the GUCs (each in bytes or milliseconds, as the engine counts). */
void
ss_fill_options(SsOptions *o)
{
	static char directory[MAXPGPATH];

	snprintf(directory, sizeof(directory), "%s/slipstream", DataDir);
	memset(o, 0, sizeof(*o));
	o->directory = directory;
#define SS_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION) \
	o->FIELD = SS_SETTING_VALUE_##KIND(guc_##FIELD, SS_SCALE_##UNIT);
#include "slipstream/engine/settings.def"
	o->max_device_size = (uint64) ss_max_device_size_mb << 20;
	o->max_value_size = Min(o->segment_size / 2, 1u << 20);
}
