/*
 * host/relfiles.c: finding the files of a relation file node in any tablespace. A keyspace is
 * tagged by database and relfilenode only (host/rowids.c), while PostgreSQL keeps a relation's
 * files under base/<db>/ or, for a table in a tablespace, under
 * pg_tblspc/<spc>/PG_15_.../<db>/. The worker's sweep, the crash reset of unlogged tables, the
 * seed and the check for a reused relfilenode all ask here whether such a file exists anywhere.
 */
#include "slipstream.h"

#include <glob.h>

#include "catalog/catalog.h"

/*
 * Whether a file named `name` (a glob pattern) of database `db` exists under base/ or in any
 * tablespace, other than `except` (NULL: none). A directory that cannot be read counts as
 * holding the file: callers drop data when nothing is found, so doubt must keep it.
 */
static bool
file_matches(Oid db, const char *name, const char *except)
{
	char		patterns[2][MAXPGPATH];
	bool		found = false;

	snprintf(patterns[0], MAXPGPATH, "base/%u/%s", db, name);
	snprintf(patterns[1], MAXPGPATH, "pg_tblspc/*/%s/%u/%s", TABLESPACE_VERSION_DIRECTORY, db,
			 name);
	for (int p = 0; p < 2 && !found; p++)
	{
		glob_t		matches;
		int			rc = glob(patterns[p], GLOB_NOSORT | GLOB_ERR, NULL, &matches);

		if (rc == GLOB_ABORTED || rc == GLOB_NOSPACE)
			found = true;
		else if (rc == 0)
		{
			for (size_t i = 0; i < matches.gl_pathc && !found; i++)
				found = except == NULL || strcmp(matches.gl_pathv[i], except) != 0;
		}
		globfree(&matches);
	}
	return found;
}

/*
 * Whether relation file node `relnode` of database `db` has files of the given kinds
 * (SS_FILES_*) in any tablespace, not counting the path `except` (NULL: none).
 */
bool
ss_relnode_has_files(Oid db, Oid relnode, int kinds, const char *except)
{
	char		name[64];

	if (kinds & SS_FILES_MAIN)
	{
		snprintf(name, sizeof(name), "%u", relnode);
		if (file_matches(db, name, except))
			return true;
	}
	if (kinds & SS_FILES_TEMP)
	{
		snprintf(name, sizeof(name), "t*_%u", relnode);
		if (file_matches(db, name, except))
			return true;
	}
	if (kinds & SS_FILES_INIT)
	{
		snprintf(name, sizeof(name), "%u_init", relnode);
		if (file_matches(db, name, except))
			return true;
	}
	return false;
}
