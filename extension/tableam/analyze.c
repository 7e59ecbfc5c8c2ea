/*
 * tableam/analyze.c: which rows of a sampled block ANALYZE reads.
 *
 * ANALYZE picks up to `targrows` blocks (300 times the largest statistics target) and reads
 * every row of each: heap's cost unit is the 8-KB page, 30 to 100 rows. A slipstream block is
 * 256 row ids, and a row costs about as much to read as the next, so reading whole blocks
 * made a 4M-row table's ANALYZE read all 4M rows where heap reads 1.8M (30,000 of its pages),
 * and a 10M-row one 7.7M. A big table's blocks are instead read a random subset of their rows
 * at a time: every row id of every sampled block is taken with one probability, the row
 * fraction, chosen so that the sample holds about twice the rows ANALYZE keeps, and each row
 * read counts for 1 / fraction rows in the live and dead totals (an unbiased estimate of
 * them). Each row is then equally likely to be read, so ANALYZE's reservoir keeps a uniform
 * sample as before. Tables small enough that their blocks would each give a tenth of their
 * rows or more are read whole, as before: their counts stay exact.
 */
#include "slipstream.h"

#include <math.h>

#include "commands/vacuum.h"
#include "common/pg_prng.h"

/* Rows read per row ANALYZE keeps, so that a density a little off still fills its sample. */
#define SS_ANALYZE_OVERSAMPLE 2.0
/* From this many rows of a block on, reading them one by one costs more than the whole block. */
#define SS_ANALYZE_POINT_READS_MAX 24

/* The sample ANALYZE takes of `rel`: 300 times its columns' largest statistics target. */
static double
analyze_target_rows(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			target = default_statistics_target;

	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (!att->attisdropped && att->attstattarget > target)
			target = att->attstattarget;
	}
	return 300.0 * Max(target, 1);
}

/*
 * The share of row ids ANALYZE reads in each block it samples of `rel`, whose row ids fill
 * `nblocks` blocks: 1 (whole blocks) unless fewer than SS_ANALYZE_POINT_READS_MAX rows per
 * block give twice the sample. The live rows per row id come from the last VACUUM or ANALYZE
 * (pg_class counts 256-row-id blocks in relpages), or are taken as 1 before any.
 */
double
ss_analyze_row_fraction(Relation rel, BlockNumber nblocks)
{
	double		targrows = analyze_target_rows(rel);
	double		sampled_blocks = Min(targrows, (double) nblocks);
	double		density = 1.0;
	double		fraction;

	if (rel->rd_rel->reltuples >= 0 && rel->rd_rel->relpages > 0)
		density = rel->rd_rel->reltuples / ((double) rel->rd_rel->relpages * SS_ROWS_PER_BLOCK);
	density = Max(Min(density, 1.0), 1.0 / SS_ROWS_PER_BLOCK);
	if (sampled_blocks <= 0)
		return 1.0;
	fraction = SS_ANALYZE_OVERSAMPLE * targrows /
		(sampled_blocks * SS_ROWS_PER_BLOCK * density);
	if (fraction * SS_ROWS_PER_BLOCK >= SS_ANALYZE_POINT_READS_MAX)
		return 1.0;
	return fraction;
}

/*
 * Draws the offsets (0..255, ascending) of a block's row ids to read, each with probability
 * `fraction` < 1, into `offsets`; returns how many. The gaps between them are geometric, so
 * the draw costs one random number per offset taken, not one per row id.
 */
int
ss_analyze_pick_offsets(double fraction, uint16 *offsets)
{
	double		log_miss = log(1.0 - fraction);
	int			count = 0;
	double		at = -1;

	for (;;)
	{
		/* pg_prng_double is in [0, 1): 1 - u is in (0, 1], so its log is finite. */
		double		u = 1.0 - pg_prng_double(&pg_global_prng_state);

		at += 1 + floor(log(u) / log_miss);
		if (at >= SS_ROWS_PER_BLOCK)
			return count;
		offsets[count++] = (uint16) at;
	}
}
