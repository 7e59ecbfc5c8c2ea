/*
 * tableam/tableam.c: the slipstream table access method routine and its handler function.
 */
#include "slipstream.h"

#include "executor/tuptable.h"
#include "fmgr.h"

/* Rows travel in plain heap-tuple slots: they are heap-format tuples outside shared buffers. */
static const TupleTableSlotOps *
ss_slot_callbacks(Relation rel)
{
	return &TTSOpsHeapTuple;
}

/* The routine, filled once per backend from the per-concern files. */
const TableAmRoutine *
ss_tableam_routine(void)
{
	static TableAmRoutine routine;
	static bool initialized = false;

	if (!initialized)
	{
		memset(&routine, 0, sizeof(routine));
		routine.type = T_TableAmRoutine;
		routine.slot_callbacks = ss_slot_callbacks;
		ss_init_scan_callbacks(&routine);
		ss_init_modify_callbacks(&routine);
		ss_init_lock_callbacks(&routine);
		ss_init_ddl_callbacks(&routine);
		ss_init_vacuum_callbacks(&routine);
		initialized = true;
	}
	return &routine;
}

PG_FUNCTION_INFO_V1(slipstream_tableam_handler);

/* The handler named by CREATE ACCESS METHOD slipstream. */
Datum
slipstream_tableam_handler(PG_FUNCTION_ARGS)
{
	PG_RETURN_POINTER(ss_tableam_routine());
}
