package metrics

import (
	"math"
	"strconv"

	"github.com/cockroachdb/pebble"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Pebble's statistics (pebble.DB.Metrics), in base units. Counters are
// Pebble's own since the store was opened, so they restart with the
// process like every other counter here.
var (
	descPebbleUsage      = desc("quill_pebble_disk_usage_bytes", "Bytes the store's files take on disk (sstables, WAL, manifest), live and obsolete.")
	descPebbleLevelFiles = desc("quill_pebble_level_files", "Sstables in each LSM level.", "level")
	descPebbleLevelSize  = desc("quill_pebble_level_size_bytes", "Bytes of the sstables in each LSM level.", "level")
	descPebbleLevelWrite = desc("quill_pebble_level_written_bytes_total", "Bytes written into each LSM level by flushes and compactions.", "level")
	descPebbleReadAmp    = desc("quill_pebble_read_amplification", "Read amplification: L0 sublevels plus non-empty levels below L0.")
	descPebbleWriteAmp   = desc("quill_pebble_write_amplification", "Write amplification since the store opened: bytes written by flushes and compactions per byte written to the WAL or ingested.")
	descPebbleCompacts   = desc("quill_pebble_compactions_total", "Compactions run.")
	descPebbleCompactSec = desc("quill_pebble_compaction_seconds_total", "Time spent in compactions.")
	descPebbleCompactRun = desc("quill_pebble_compactions_in_progress", "Compactions running now.")
	descPebbleDebt       = desc("quill_pebble_compaction_debt_bytes", "Estimated bytes to compact for the LSM to reach a stable shape.")
	descPebbleFlushes    = desc("quill_pebble_flushes_total", "Memtable flushes.")
	descPebbleMemSize    = desc("quill_pebble_memtable_size_bytes", "Bytes allocated by memtables and large batches.")
	descPebbleMemCount   = desc("quill_pebble_memtables", "Memtables, the mutable one included.")
	descPebbleMemZombie  = desc("quill_pebble_memtable_zombie_bytes", "Bytes of memtables no longer in use but not yet freed (one is kept for the next rotation to reuse).")
	descPebbleWALFiles   = desc("quill_pebble_wal_files", "Live write-ahead log files.")
	descPebbleWALSize    = desc("quill_pebble_wal_size_bytes", "Bytes of the live write-ahead log files on disk.")
	descPebbleWALWritten = desc("quill_pebble_wal_written_bytes_total", "Bytes written to the write-ahead log.")
	descPebbleCacheSize  = desc("quill_pebble_block_cache_size_bytes", "Bytes in the block cache.")
	descPebbleCacheHits  = desc("quill_pebble_block_cache_hits_total", "Block cache hits.")
	descPebbleCacheMiss  = desc("quill_pebble_block_cache_misses_total", "Block cache misses.")
	descPebbleFsync      = desc("quill_pebble_wal_fsync_seconds", "Time of each fsync of the write-ahead log (what a delivery's 250 waits for).")
)

func describePebble(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPebbleUsage, descPebbleLevelFiles, descPebbleLevelSize, descPebbleLevelWrite,
		descPebbleReadAmp, descPebbleWriteAmp, descPebbleCompacts, descPebbleCompactSec, descPebbleCompactRun, descPebbleDebt,
		descPebbleFlushes, descPebbleMemSize, descPebbleMemCount, descPebbleMemZombie, descPebbleWALFiles, descPebbleWALSize, descPebbleWALWritten,
		descPebbleCacheSize, descPebbleCacheHits, descPebbleCacheMiss, descPebbleFsync} {
		ch <- d
	}
}

func collectPebble(id string, m *pebble.Metrics, ch chan<- prometheus.Metric) {
	gauge(ch, descPebbleUsage, float64(m.DiskSpaceUsage()), id)
	for i := range m.Levels {
		l, level := &m.Levels[i], strconv.Itoa(i)
		gauge(ch, descPebbleLevelFiles, float64(l.NumFiles), id, level)
		gauge(ch, descPebbleLevelSize, float64(l.Size), id, level)
		counter(ch, descPebbleLevelWrite, float64(l.BytesFlushed+l.BytesCompacted), id, level)
	}
	total := m.Total()
	gauge(ch, descPebbleReadAmp, float64(m.ReadAmp()), id)
	gauge(ch, descPebbleWriteAmp, total.WriteAmp(), id)
	counter(ch, descPebbleCompacts, float64(m.Compact.Count), id)
	counter(ch, descPebbleCompactSec, m.Compact.Duration.Seconds(), id)
	gauge(ch, descPebbleCompactRun, float64(m.Compact.NumInProgress), id)
	gauge(ch, descPebbleDebt, float64(m.Compact.EstimatedDebt), id)
	counter(ch, descPebbleFlushes, float64(m.Flush.Count), id)
	gauge(ch, descPebbleMemSize, float64(m.MemTable.Size), id)
	gauge(ch, descPebbleMemCount, float64(m.MemTable.Count), id)
	gauge(ch, descPebbleMemZombie, float64(m.MemTable.ZombieSize), id)
	gauge(ch, descPebbleWALFiles, float64(m.WAL.Files), id)
	gauge(ch, descPebbleWALSize, float64(m.WAL.PhysicalSize), id)
	counter(ch, descPebbleWALWritten, float64(m.WAL.BytesWritten), id)
	gauge(ch, descPebbleCacheSize, float64(m.BlockCache.Size), id)
	counter(ch, descPebbleCacheHits, float64(m.BlockCache.Hits), id)
	counter(ch, descPebbleCacheMiss, float64(m.BlockCache.Misses), id)
	if h := m.LogWriter.FsyncLatency; h != nil {
		var out dto.Metric
		if h.Write(&out) == nil && out.Histogram != nil {
			count, sum, buckets := fsyncBuckets(out.Histogram)
			ch <- prometheus.MustNewConstHistogram(descPebbleFsync, count, sum, buckets, id)
		}
	}
}

// fsyncTargets are the bucket bounds (seconds) the WAL fsync histogram is
// reported near. Pebble's own has about a hundred bounds in nanoseconds
// (pebble.FsyncLatencyBuckets: every 100 µs up to 5 ms, then 50 steps of
// about 17% up to 10 s); each target takes the nearest of them, so every
// reported count is Pebble's own, at a bound within 9% of the target,
// written to three significant digits (the exponential bounds are not
// round numbers).
var fsyncTargets = []float64{0.0001, 0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// fsyncBuckets converts Pebble's fsync histogram (nanoseconds) to seconds
// on the bounds nearest fsyncTargets: count, sum and cumulative counts.
func fsyncBuckets(h *dto.Histogram) (count uint64, sum float64, buckets map[float64]uint64) {
	buckets = map[float64]uint64{}
	bs := h.GetBucket()
	for _, t := range fsyncTargets {
		best := -1
		for i, b := range bs {
			if b.GetUpperBound() <= 0 {
				continue
			}
			if best < 0 || math.Abs(math.Log(b.GetUpperBound()/1e9/t)) < math.Abs(math.Log(bs[best].GetUpperBound()/1e9/t)) {
				best = i
			}
		}
		if best >= 0 {
			bound, _ := strconv.ParseFloat(strconv.FormatFloat(bs[best].GetUpperBound()/1e9, 'g', 3, 64), 64)
			buckets[bound] = bs[best].GetCumulativeCount()
		}
	}
	return h.GetSampleCount(), h.GetSampleSum() / 1e9, buckets
}
