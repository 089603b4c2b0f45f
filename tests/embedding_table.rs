//! Tests of the table file, its validation and its arithmetic.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use half::{bf16, f16};

use common::TempDir;
use ringrec::embedding::format::{CHECKSUM_AT, HEADER_LEN};
use ringrec::embedding::*;
use ringrec::hash::fnv1a64;
use ringrec::frame::FrameError;
use ringrec::header::FormatError;

fn cfg(dim: u32, cap: u64, dtype: StorageDtype, opt: OptimizerKind) -> TableConfig {
    let mut c = TableConfig::new(dim, cap);
    c.dtype = dtype;
    c.optimizer = opt;
    c.seed = 99;
    c
}

fn grads(keys: &[u64], dim: usize, salt: u64) -> Vec<f32> {
    keys.iter().flat_map(|k| (0..dim).map(move |j| ((k * 13 + j as u64 * 7 + salt) % 23) as f32 / 23.0 - 0.5)).collect()
}

fn row(t: &EmbeddingTable, key: u64) -> Vec<f32> {
    let mut out = vec![0f32; t.dim()];
    t.lookup(&[key], &mut out).unwrap();
    out
}

/// A small valid table file with some rows; returns its bytes.
fn sample_file(dir: &TempDir, dtype: StorageDtype, opt: OptimizerKind) -> (PathBuf, Vec<u8>) {
    let p = dir.path("sample");
    let mut t = EmbeddingTable::create(&p, &cfg(4, 64, dtype, opt)).unwrap();
    let keys: Vec<u64> = (0..40).map(|i| i * 1_000_003).collect();
    t.apply_updates(&keys, &grads(&keys, 4, 1), 0.5).unwrap();
    drop(t);
    let bytes = std::fs::read(&p).unwrap();
    (p, bytes)
}

#[test]
fn create_is_exclusive_private_and_empty() {
    let dir = TempDir::new("emb");
    let p = dir.path("t");
    let t = EmbeddingTable::create(&p, &cfg(8, 100, StorageDtype::F32, OptimizerKind::Sgd)).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(t.header().capacity, 128, "capacity rounds up to a power of two");
    assert_eq!(t.live_rows(), 0);
    assert!(matches!(EmbeddingTable::create(&p, &cfg(8, 100, StorageDtype::F32, OptimizerKind::Sgd)), Err(TableError::Exists { .. })));
    let info = t.inspect();
    // Header, index (128 x 8 bytes), rows (128 x 8 x 4 bytes), block checksums: a page each.
    assert_eq!(info.file_bytes, 4096 + 4096 + 4096 + 4096);
    assert!(!info.checksums, "a live table carries no checksums");
    assert!(info.to_string().contains("0 live / 102 max / 128 slots"), "{info}");
}

#[test]
fn sgd_step_matches_hand_computation() {
    let dir = TempDir::new("emb");
    let mut t = EmbeddingTable::create(&dir.path("t"), &cfg(2, 16, StorageDtype::F32, OptimizerKind::Sgd)).unwrap();
    let w0 = row(&t, 5);
    t.apply_updates(&[5], &[1.0, -2.0], 0.25).unwrap();
    assert_eq!(row(&t, 5), vec![w0[0] - 0.25, w0[1] + 0.5]);
    // The same key twice in one batch steps twice, in order.
    t.apply_updates(&[5, 5], &[1.0, 0.0, 1.0, 0.0], 0.5).unwrap();
    assert_eq!(row(&t, 5), vec![w0[0] - 0.25 - 0.5 - 0.5, w0[1] + 0.5]);
    assert_eq!(t.live_rows(), 1);
    assert_eq!(t.generation(), 2);
}

#[test]
fn adagrad_step_matches_hand_computation() {
    let dir = TempDir::new("emb");
    let mut c = cfg(2, 16, StorageDtype::F32, OptimizerKind::Adagrad);
    c.adagrad_init = 0.5;
    c.adagrad_eps = 1e-6;
    let mut t = EmbeddingTable::create(&dir.path("t"), &c).unwrap();
    let w0 = row(&t, 9);
    // acc = 0.5 + (3^2 + 4^2) / 2 = 13; w -= 0.1 * g / (sqrt(13) + 1e-6)
    t.apply_updates(&[9], &[3.0, 4.0], 0.1).unwrap();
    let acc = 0.5f32 + 12.5;
    assert_eq!(t.accumulator(9), Some(acc));
    let denom = acc.sqrt() + 1e-6;
    assert_eq!(row(&t, 9), vec![w0[0] - 0.1 * 3.0 / denom, w0[1] - 0.1 * 4.0 / denom]);
    // Second step: acc = 13 + (1 + 0) / 2.
    t.apply_updates(&[9], &[1.0, 0.0], 0.1).unwrap();
    assert_eq!(t.accumulator(9), Some(13.5));
    let w1 = w0[0] - 0.1 * 3.0 / denom;
    assert_eq!(row(&t, 9)[0], w1 - 0.1 * 1.0 / (13.5f32.sqrt() + 1e-6));
}

#[test]
fn unseen_keys_read_their_initial_row_before_and_after_insertion() {
    let dir = TempDir::new("emb");
    for (i, dtype) in [StorageDtype::F32, StorageDtype::F16, StorageDtype::Bf16].into_iter().enumerate() {
        let mut t = EmbeddingTable::create(&dir.path(&format!("t{i}")), &cfg(16, 64, dtype, OptimizerKind::Sgd)).unwrap();
        let before = row(&t, 424242);
        assert!(before.iter().all(|x| x.abs() <= 0.25), "scale 1/sqrt(16)");
        assert!(!t.contains(424242));
        t.apply_updates(&[424242], &[0.0; 16], 1.0).unwrap();
        assert!(t.contains(424242));
        let after = row(&t, 424242);
        assert_eq!(before.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), after.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{dtype}");
        let mut want = vec![0f32; 16];
        init::init_row_f32(424242, 99, 0.25, &mut want);
        match dtype {
            StorageDtype::F32 => assert_eq!(before, want),
            StorageDtype::F16 => assert_eq!(before, want.iter().map(|x| f16::from_f32(*x).to_f32()).collect::<Vec<_>>()),
            StorageDtype::Bf16 => assert_eq!(before, want.iter().map(|x| bf16::from_f32(*x).to_f32()).collect::<Vec<_>>()),
        }
    }
}

#[test]
fn lookup_present_packs_the_present_rows_and_names_the_absent_keys() {
    // Below and above the parallel gather's threshold (its chunks close up their rows), with
    // absent keys in every chunk, none, or all.
    let dir = TempDir::new("emb");
    for (i, dtype) in [StorageDtype::F32, StorageDtype::Bf16].into_iter().enumerate() {
        let mut t = EmbeddingTable::create(&dir.path(&format!("p{i}")), &cfg(4, 1 << 16, dtype, OptimizerKind::Sgd)).unwrap();
        let stored: Vec<u64> = (0..20_000u64).filter(|k| k % 3 != 0).collect();
        t.apply_updates(&stored, &grads(&stored, 4, 2), 0.5).unwrap();
        for keys in [(0..50u64).collect::<Vec<_>>(), (0..30_000).collect(), (0..30_000).filter(|k| k % 3 != 0).collect(), (0..20_000).map(|k| 3 * k).collect()] {
            let mut all = vec![0f32; keys.len() * 4];
            t.lookup(&keys, &mut all).unwrap();
            let (mut packed, mut absent) = (vec![0f32; keys.len() * 4], vec![7u32]);
            let present = t.lookup_present(&keys, &mut packed, &mut absent).unwrap();
            let want_absent: Vec<u32> = (0..keys.len() as u32).filter(|n| !t.contains(keys[*n as usize])).collect();
            assert_eq!(absent, want_absent, "{dtype}, {} keys", keys.len());
            assert_eq!(present, keys.len() - absent.len());
            let want: Vec<f32> = (0..keys.len()).filter(|n| t.contains(keys[*n])).flat_map(|n| all[n * 4..n * 4 + 4].to_vec()).collect();
            assert!(packed[..present * 4] == want[..], "{dtype}, {} keys: the present rows", keys.len());
        }
    }
}

#[test]
fn half_storage_rounds_values_and_halves_the_rows() {
    let dir = TempDir::new("emb");
    let mut t16 = EmbeddingTable::create(&dir.path("f16"), &cfg(4, 16, StorageDtype::F16, OptimizerKind::Sgd)).unwrap();
    let mut tb = EmbeddingTable::create(&dir.path("bf16"), &cfg(4, 16, StorageDtype::Bf16, OptimizerKind::Sgd)).unwrap();
    let v = [1.0f32 / 3.0, 1e-3, -7.77, 65504.0];
    t16.put_rows(&[1], &v).unwrap();
    tb.put_rows(&[1], &v).unwrap();
    assert_eq!(row(&t16, 1), v.iter().map(|x| f16::from_f32(*x).to_f32()).collect::<Vec<_>>());
    assert_eq!(row(&tb, 1), v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect::<Vec<_>>());
    assert_eq!(t16.header().layout.rows_len, 16 * 4 * 2);
    // f32 arithmetic, rounded once on store.
    t16.apply_updates(&[1], &[1.0, 0.0, 0.0, 0.0], 0.001).unwrap();
    let w = f16::from_f32(1.0f32 / 3.0).to_f32();
    assert_eq!(row(&t16, 1)[0], f16::from_f32(w - 0.001).to_f32());
}

#[test]
fn full_table_error_names_capacity_and_flag_and_changes_nothing() {
    let dir = TempDir::new("emb");
    let mut t = EmbeddingTable::create(&dir.path("t"), &cfg(2, 16, StorageDtype::F32, OptimizerKind::Sgd)).unwrap();
    let keys: Vec<u64> = (0..12).collect();
    t.apply_updates(&keys, &grads(&keys, 2, 0), 0.1).unwrap();
    let before = t.as_bytes().to_vec();
    let err = t.apply_updates(&[100, 101], &[0.0; 4], 0.1).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TableError::Full { capacity: 16, live: 12, new: 2, max_rows: 12, .. }), "{msg}");
    assert!(msg.contains("16 slots") && msg.contains("--table-capacity") && msg.contains("at least 32"), "{msg}");
    assert_eq!(t.as_bytes(), &before[..], "a failed batch writes nothing");
    // Updating present keys still works at the limit.
    t.apply_updates(&[3], &[1.0, 1.0], 0.1).unwrap();
}

#[test]
fn reserved_key_and_bad_shapes_are_rejected() {
    let dir = TempDir::new("emb");
    let mut t = EmbeddingTable::create(&dir.path("t"), &cfg(2, 16, StorageDtype::F32, OptimizerKind::Sgd)).unwrap();
    let mut out = [0f32; 2];
    assert!(matches!(t.lookup(&[u64::MAX], &mut out), Err(TableError::ReservedKey { .. })));
    assert!(matches!(t.apply_updates(&[u64::MAX], &[0.0; 2], 0.1), Err(TableError::ReservedKey { .. })));
    let e = t.apply_updates(&[1, 2], &[0.0; 3], 0.1).unwrap_err();
    assert!(matches!(e, TableError::Shape { expected: 4, got: 3, .. }), "{e}");
    assert!(matches!(t.lookup(&[1], &mut [0f32; 3]), Err(TableError::Shape { .. })));
    assert!(matches!(t.apply_updates(&[1], &[0.0; 2], f32::NAN), Err(TableError::Config(_))));
    assert_eq!(t.generation(), 0);
}

#[test]
fn read_only_handle_refuses_writes_and_sees_leader_updates() {
    let dir = TempDir::new("emb");
    let p = dir.path("t");
    let mut w = EmbeddingTable::create(&p, &cfg(4, 64, StorageDtype::F32, OptimizerKind::Adagrad)).unwrap();
    let mut r = EmbeddingTable::open_readonly(&p).unwrap();
    assert!(!r.is_writable());
    assert!(matches!(r.apply_updates(&[1], &[0.0; 4], 0.1), Err(TableError::ReadOnly)));
    assert!(matches!(r.put_rows(&[1], &[0.0; 4]), Err(TableError::ReadOnly)));
    w.apply_updates(&[1, 2, 3], &grads(&[1, 2, 3], 4, 5), 0.1).unwrap();
    // Same memory: the reader sees the rows at once, the header after refresh().
    assert_eq!(row(&r, 2), row(&w, 2));
    r.refresh().unwrap();
    assert_eq!(r.live_rows(), 3);
    assert_eq!(r.generation(), 1);
}

#[test]
fn same_updates_give_byte_identical_files() {
    let dir = TempDir::new("emb");
    let c = cfg(8, 256, StorageDtype::Bf16, OptimizerKind::Adagrad);
    let mut a = EmbeddingTable::create(&dir.path("a"), &c).unwrap();
    let mut b = EmbeddingTable::create(&dir.path("b"), &c).unwrap();
    for step in 0..5u64 {
        let keys: Vec<u64> = (0..50).map(|i| (i * 7 + step * 3) % 120).collect();
        let g = grads(&keys, 8, step);
        a.apply_updates(&keys, &g, 0.05).unwrap();
        b.apply_updates(&keys, &g, 0.05).unwrap();
    }
    assert_eq!(a.as_bytes(), b.as_bytes());
}

#[test]
fn save_and_load_round_trip_byte_identical() {
    let dir = TempDir::new("emb");
    for (i, dtype) in [StorageDtype::F32, StorageDtype::F16, StorageDtype::Bf16].into_iter().enumerate() {
        let mut t = EmbeddingTable::create(&dir.path(&format!("t{i}")), &cfg(8, 128, dtype, OptimizerKind::Adagrad)).unwrap();
        let keys: Vec<u64> = (0..90).map(|k| k * 0x1234_5678_9abc).collect();
        t.apply_updates(&keys, &grads(&keys, 8, 3), 0.2).unwrap();
        let saved = dir.path(&format!("saved{i}"));
        t.save(&saved).unwrap();
        // The saved file: the live body, the checksums flag set, the sums of the body.
        let l = t.header().layout;
        let file = std::fs::read(&saved).unwrap();
        let body = l.index_offset as usize..l.sums_offset as usize;
        assert!(file.len() == t.as_bytes().len() && file[body.clone()] == t.as_bytes()[body.clone()], "{dtype}: the body is saved as is");
        assert_eq!(file[28], 1, "checksums flag");
        assert_eq!(file[l.sums_offset as usize..][..4], ringrec::hash::crc32(&file[body.clone()]).to_le_bytes(), "one block, its CRC-32");
        let saved_table = EmbeddingTable::open_readonly(&saved).unwrap();
        assert!(saved_table.inspect().checksums && saved_table.inspect().to_string().contains("CRC-32 of 1 blocks of 1 MiB (every open compares them all)"));
        let loaded = EmbeddingTable::load(&saved, &dir.path(&format!("loaded{i}"))).unwrap();
        assert!(loaded.is_writable());
        assert!(loaded.as_bytes() == t.as_bytes(), "{dtype}: the loaded copy is the live table, byte for byte");
        assert_eq!(loaded.header(), t.header());
        assert!(!loaded.header().sums_valid);
        // Saving over an existing file replaces it atomically; no temp file is left.
        t.apply_updates(&keys[..3], &grads(&keys[..3], 8, 4), 0.2).unwrap();
        t.save(&saved).unwrap();
        let again = EmbeddingTable::load(&saved, &dir.path(&format!("again{i}"))).unwrap();
        assert!(again.as_bytes() == t.as_bytes());
    }
    let names: Vec<String> = std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
}

#[test]
fn params_export_import_round_trip_is_bit_exact() {
    let dir = TempDir::new("emb");
    for (i, dtype) in [StorageDtype::F32, StorageDtype::F16, StorageDtype::Bf16].into_iter().enumerate() {
        let c = cfg(6, 256, dtype, OptimizerKind::Sgd);
        let mut t = EmbeddingTable::create(&dir.path(&format!("t{i}")), &c).unwrap();
        let keys: Vec<u64> = (0..150).map(|k| k * 977 + 5).collect();
        t.apply_updates(&keys, &grads(&keys, 6, 8), 0.3).unwrap();
        let params = dir.path(&format!("p{i}.bin"));
        assert_eq!(t.export_params(&params).unwrap(), 150);
        assert_eq!(std::fs::metadata(&params).unwrap().len(), 32 + 16 + 150 * (8 + 24) + 4, "frame header, payload header, records, CRC-32");
        let u = EmbeddingTable::import_params(&params, &dir.path(&format!("u{i}")), &c).unwrap();
        assert_eq!(u.live_rows(), 150);
        let mut a = vec![0f32; 150 * 6];
        let mut b = vec![0f32; 150 * 6];
        t.lookup(&keys, &mut a).unwrap();
        u.lookup(&keys, &mut b).unwrap();
        assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        // Exporting the import again gives the same bytes.
        let again = dir.path(&format!("q{i}.bin"));
        u.export_params(&again).unwrap();
        assert_eq!(std::fs::read(&params).unwrap(), std::fs::read(&again).unwrap());
        // TSV: one line per row, keys ascending, values parse back to the same bits.
        let mut tsv = Vec::new();
        assert_eq!(t.write_tsv(&mut tsv).unwrap(), 150);
        let text = String::from_utf8(tsv).unwrap();
        let first: Vec<&str> = text.lines().next().unwrap().split('\t').collect();
        assert_eq!(first[0], "5");
        let parsed: Vec<f32> = first[1..].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(parsed, row(&t, 5));
    }
}

#[test]
fn import_rejects_bad_params_files_and_leaves_no_table() {
    let dir = TempDir::new("emb");
    let params = dir.path("p.bin");
    write_params(&params, 4, &[1, 2, 3], &[0.5; 12]).unwrap();
    let mut bytes = std::fs::read(&params).unwrap();
    let table = dir.path("t");
    // Wrong dim in the config.
    let e = EmbeddingTable::import_params(&params, &table, &cfg(8, 64, StorageDtype::F32, OptimizerKind::Sgd)).unwrap_err();
    assert!(e.to_string().contains("--dim 4"), "{e}");
    // Truncated, bad magic, reserved key.
    bytes.pop();
    std::fs::write(&params, &bytes).unwrap();
    let e = EmbeddingTable::import_params(&params, &table, &cfg(4, 64, StorageDtype::F32, OptimizerKind::Sgd)).unwrap_err();
    assert!(matches!(e, TableError::Frame(FrameError::Truncated { .. })) && e.to_string().contains("truncated"), "{e}");
    write_params(&params, 4, &[1, u64::MAX], &[0.5; 8]).unwrap();
    let e = EmbeddingTable::import_params(&params, &table, &cfg(4, 64, StorageDtype::F32, OptimizerKind::Sgd)).unwrap_err();
    assert!(e.to_string().contains("reserved key"), "{e}");
    assert!(!table.exists(), "a failed import removes the new table");
    std::fs::write(&params, b"RRTABLE\0garbage-garbage-garbage").unwrap();
    assert!(matches!(read_params_header(&params), Err(TableError::Frame(FrameError::BadMagic { .. }))));
    // Too many records for the capacity.
    let keys: Vec<u64> = (0..20).collect();
    write_params(&params, 1, &keys, &[1.0; 20]).unwrap();
    let e = EmbeddingTable::import_params(&params, &table, &cfg(1, 16, StorageDtype::F32, OptimizerKind::Sgd)).unwrap_err();
    assert!(matches!(e, TableError::Full { .. }), "{e}");
    assert!(!table.exists());
}

/// Rewrites the header checksum after a deliberate edit, so the check after it is reached.
fn fix_checksum(b: &mut [u8]) {
    let s = fnv1a64(&b[..CHECKSUM_AT]);
    b[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&s.to_le_bytes());
}

fn open_bytes(dir: &TempDir, name: &str, bytes: &[u8]) -> Result<EmbeddingTable, TableError> {
    let p = dir.path(name);
    let _ = std::fs::remove_file(&p);
    std::fs::write(&p, bytes).unwrap();
    EmbeddingTable::open_readonly(&p)
}

#[test]
fn every_corruption_kind_has_its_own_error() {
    let dir = TempDir::new("emb");
    let (_, good) = sample_file(&dir, StorageDtype::F16, OptimizerKind::Adagrad);
    assert!(open_bytes(&dir, "ok", &good).is_ok());

    let e = open_bytes(&dir, "trunc", &good[..good.len() - 4096]).unwrap_err();
    assert!(matches!(e, TableError::Format(FormatError::Truncated { .. })) && e.to_string().contains("truncated"), "{e}");
    let e = open_bytes(&dir, "tiny", &good[..100]).unwrap_err();
    assert!(matches!(e, TableError::Format(FormatError::Truncated { need: HEADER_LEN, .. })), "{e}");

    let mut b = good.clone();
    b[0] = b'X';
    let e = open_bytes(&dir, "magic", &b).unwrap_err();
    assert!(matches!(e, TableError::Format(FormatError::BadMagic { .. })) && e.to_string().contains("not a ringrec embedding table"), "{e}");

    let mut b = good.clone();
    b[8] = 7;
    let e = open_bytes(&dir, "version", &b).unwrap_err();
    assert!(matches!(e, TableError::Format(FormatError::BadVersion { found: 7, supported: 3, .. })), "{e}");

    let mut b = good.clone();
    b[48] ^= 1; // generation, checksum not fixed
    let e = open_bytes(&dir, "checksum", &b).unwrap_err();
    assert!(matches!(e, TableError::Format(FormatError::BadChecksum { .. })) && e.to_string().contains("checksum"), "{e}");

    let mut b = good.clone();
    b[96..104].copy_from_slice(&(1u64 << 40).to_le_bytes()); // rows offset far outside
    fix_checksum(&mut b);
    let e = open_bytes(&dir, "offsets", &b).unwrap_err();
    assert!(matches!(e, TableError::Format(FormatError::BadLayout { .. })) && e.to_string().contains("layout"), "{e}");
    let mut b = good.clone();
    b[96..104].copy_from_slice(&(4096u64).to_le_bytes()); // rows overlapping the index
    fix_checksum(&mut b);
    assert!(matches!(open_bytes(&dir, "overlap", &b), Err(TableError::Format(FormatError::BadLayout { .. }))));

    let mut b = good.clone();
    b[16..20].copy_from_slice(&0u32.to_le_bytes()); // dim 0
    fix_checksum(&mut b);
    assert!(matches!(open_bytes(&dir, "dim", &b), Err(TableError::Format(FormatError::BadHeader { field: "dim", .. }))));

    let mut b = good.clone();
    b[40..48].copy_from_slice(&41u64.to_le_bytes()); // live rows off by one
    fix_checksum(&mut b);
    let e = open_bytes(&dir, "live", &b).unwrap_err();
    assert!(matches!(e, TableError::CorruptIndex { .. }), "{e}");

    let mut b = good.clone();
    b.extend_from_slice(&[0u8; 4096]);
    assert!(matches!(open_bytes(&dir, "long", &b), Err(TableError::Format(FormatError::BadLayout { .. }))));
}

#[test]
fn another_users_table_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: chown to another uid needs root");
        return;
    }
    let dir = TempDir::new("emb");
    let (p, _) = sample_file(&dir, StorageDtype::F32, OptimizerKind::Sgd);
    std::os::unix::fs::chown(&p, Some(12345), None).unwrap();
    let e = EmbeddingTable::open_readonly(&p).unwrap_err();
    assert!(matches!(e, TableError::WrongOwner { owner: 12345, euid: 0, .. }), "{e}");
}

/// xorshift64: the fuzz loops' deterministic randomness.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn mutated_files_never_panic() {
    let dir = TempDir::new("emb");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // A live table, and a saved one (checksums flag set, its sums section filled).
    let samples = [sample_file(&dir, StorageDtype::F32, OptimizerKind::Sgd).1, {
        let d2 = TempDir::new("emb");
        let (p, _) = sample_file(&d2, StorageDtype::Bf16, OptimizerKind::Adagrad);
        let saved = d2.path("saved");
        EmbeddingTable::open_readonly(&p).unwrap().save(&saved).unwrap();
        std::fs::read(&saved).unwrap()
    }];
    let p = dir.path("fuzz");
    let mut opened = 0;
    for case in 0..3000 {
        let mut b = samples[case % 2].clone();
        match rng.below(6) {
            0 => b.truncate(rng.below(b.len())),
            1 => b.extend((0..rng.below(9000)).map(|_| rng.next() as u8)),
            2 => {
                // Mutate header fields, keeping the checksum valid half of the time.
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(CHECKSUM_AT);
                    b[i] = rng.next() as u8;
                }
                if rng.below(2) == 0 {
                    fix_checksum(&mut b);
                }
            }
            3 => {
                // Overwrite a whole u64 field (sums offset and length included) with an
                // extreme value.
                let i = 32 + 8 * rng.below(15);
                let v = [0u64, 1, u64::MAX, 1 << 63, 4096, 4095, rng.next()][rng.below(7)];
                b[i..i + 8].copy_from_slice(&v.to_le_bytes());
                fix_checksum(&mut b);
            }
            4 => {
                // Damage the index or rows.
                for _ in 0..1 + rng.below(16) {
                    let i = 4096 + rng.below(b.len() - 4096);
                    b[i] = rng.next() as u8;
                }
            }
            _ => {
                for _ in 0..1 + rng.below(8) {
                    let i = rng.below(b.len());
                    b[i] ^= 1 << rng.below(8);
                }
            }
        }
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, &b).unwrap();
        if let Ok(t) = EmbeddingTable::open_readonly(&p) {
            opened += 1;
            let keys: Vec<u64> = (0..64).map(|_| rng.next() % 50_000_000).collect();
            let mut out = vec![0f32; keys.len() * t.dim()];
            t.lookup(&keys, &mut out).unwrap();
            let _ = t.inspect().to_string();
            let _ = t.live_keys();
        }
        if let Ok(mut t) = EmbeddingTable::open_readwrite(&p) {
            let keys: Vec<u64> = (0..8).map(|_| rng.next() % 1000).collect();
            let g = vec![0.5f32; keys.len() * t.dim()];
            let _ = t.apply_updates(&keys, &g, 0.1);
        }
    }
    assert!(opened > 100, "some mutations (row bytes of the live table) leave a valid table: {opened}");
}

#[test]
fn large_batches_gather_in_parallel_and_agree_with_small_ones() {
    let dir = TempDir::new("emb");
    let mut t = EmbeddingTable::create(&dir.path("t"), &cfg(16, 1 << 16, StorageDtype::F32, OptimizerKind::Sgd)).unwrap();
    let keys: Vec<u64> = (0..40_000).map(|k| k * 3).collect();
    t.apply_updates(&keys, &grads(&keys, 16, 2), 0.1).unwrap();
    let batch: Vec<u64> = (0..table::PAR_MIN_KEYS as u64 * 2).map(|k| k * 5).collect();
    let mut big = vec![0f32; batch.len() * 16];
    t.lookup(&batch, &mut big).unwrap();
    for (i, k) in batch.iter().enumerate().step_by(97) {
        assert_eq!(&big[i * 16..i * 16 + 16], &row(&t, *k)[..]);
    }
}

#[test]
fn segment_guard_removes_on_drop() {
    let dir = TempDir::new("emb");
    let p = dir.path("seg");
    std::fs::write(&p, b"x").unwrap();
    {
        let _g = SegmentGuard::new(&p);
    }
    assert!(!p.exists());
    std::fs::write(&p, b"x").unwrap();
    let mut g = SegmentGuard::new(&p);
    g.disarm();
    drop(g);
    assert!(p.exists());
    assert!(ringrec::shm::segment_path(Path::new("/dev/shm"), "job 1", 3, "table").to_string_lossy().ends_with("/dev/shm/ringrec-job_1-h3-table"));
}

/// Child half of `readonly_mapping_faults_on_write`.
#[test]
#[ignore]
fn readonly_fault_child() {
    let Ok(p) = std::env::var("RINGREC_FAULT_TABLE") else { return };
    let t = EmbeddingTable::open_readonly(Path::new(&p)).unwrap();
    let at = t.as_bytes().as_ptr() as *mut u8;
    // SAFETY: deliberately wrong: a write through a PROT_READ mapping must fault (SIGSEGV).
    unsafe { std::ptr::write_volatile(at.add(5000), 1) };
    println!("write did not fault");
}

#[test]
fn readonly_mapping_faults_on_write() {
    use std::os::unix::process::ExitStatusExt;
    let dir = TempDir::new("emb");
    let (p, _) = sample_file(&dir, StorageDtype::F32, OptimizerKind::Sgd);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "readonly_fault_child", "--nocapture", "--test-threads=1"])
        .env("RINGREC_FAULT_TABLE", &p)
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn parallel_updates_of_distinct_keys_equal_the_sequential_path_byte_for_byte() {
    for (dtype, optimizer) in [(StorageDtype::F32, OptimizerKind::Sgd), (StorageDtype::F16, OptimizerKind::Adagrad), (StorageDtype::Bf16, OptimizerKind::Sgd)] {
        let dir = TempDir::new("emb");
        let mut cfg = TableConfig::new(8, 1 << 14);
        cfg.dtype = dtype;
        cfg.optimizer = optimizer;
        let mut seq = EmbeddingTable::create(&dir.path("seq"), &cfg).unwrap();
        let mut par = EmbeddingTable::create(&dir.path("par"), &cfg).unwrap();
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let two = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for step in 0..4u64 {
            // Sorted distinct keys, half of them seen in the previous step.
            let mut keys: Vec<u64> = (0..3000u64).map(|i| (i + step * 1500).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 8).collect();
            keys.sort_unstable();
            keys.dedup();
            assert!(keys.len() >= table::PAR_MIN_UPDATES);
            let grads: Vec<f32> = (0..keys.len() * 8).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
            let a = one.install(|| seq.apply_updates(&keys, &grads, 0.1)).unwrap();
            let b = two.install(|| par.apply_updates(&keys, &grads, 0.1)).unwrap();
            assert_eq!((a.inserted, a.updated, a.generation), (b.inserted, b.updated, b.generation));
        }
        assert!(seq.as_bytes() == par.as_bytes(), "{dtype:?} {optimizer:?}: files differ");
    }
}

#[test]
fn one_batch_of_colliding_new_keys_lands_where_key_by_key_insertion_puts_them() {
    // A small table (64 slots) and 40 new keys, repeats included and in no order: the
    // batch resolves every absent key's free slot first, then inserts; the result must be
    // the slots a key-by-key insertion (each probe from the key's home) gives.
    let dir = TempDir::new("emb");
    let c = cfg(4, 64, StorageDtype::F32, OptimizerKind::Sgd);
    let mut batch = EmbeddingTable::create(&dir.path("batch"), &c).unwrap();
    let mut one_by_one = EmbeddingTable::create(&dir.path("single"), &c).unwrap();
    let mut keys: Vec<u64> = (0..36u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 3).collect();
    keys.extend([keys[3], keys[17], keys[3], keys[30]]);
    keys.swap(5, 29);
    let grads: Vec<f32> = (0..keys.len() * 4).map(|i| (i % 7) as f32 * 0.25 - 0.5).collect();
    batch.apply_updates(&keys, &grads, 0.1).unwrap();
    for (n, k) in keys.iter().enumerate() {
        one_by_one.apply_updates(&[*k], &grads[n * 4..n * 4 + 4], 0.1).unwrap();
    }
    for k in &keys {
        assert_eq!(batch.slot_of(*k), one_by_one.slot_of(*k), "key {k:#x}");
    }
    let l = batch.header().layout;
    let body = |t: &EmbeddingTable| t.as_bytes()[l.index_offset as usize..(l.rows_offset + l.rows_len) as usize].to_vec();
    assert!(body(&batch) == body(&one_by_one), "index and rows must be byte-identical");
    assert_eq!(batch.live_rows(), 36);
}

/// Child half of `save_on_a_one_thread_pool_finishes`: the trainer saves from a rayon
/// worker, and a rank given one core has a global pool of one thread.
#[test]
#[ignore]
fn save_on_one_thread_child() {
    let Ok(p) = std::env::var("RINGREC_SAVE_TABLE") else { return };
    rayon::ThreadPoolBuilder::new().num_threads(1).build_global().unwrap();
    // Several checksum blocks, so that computing them splits into rayon tasks.
    let t = EmbeddingTable::create(Path::new(&p), &TableConfig::new(16, 1 << 16)).unwrap();
    let saved = PathBuf::from(format!("{p}.saved"));
    rayon::scope(|_| t.save(&saved)).unwrap();
    assert!(EmbeddingTable::open_readonly(&saved).unwrap().header().sums_valid);
    println!("saved");
}

#[test]
fn save_on_a_one_thread_pool_finishes() {
    let dir = TempDir::new("emb");
    let p = dir.path("t");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "save_on_one_thread_child", "--nocapture", "--test-threads=1"])
        .env("RINGREC_SAVE_TABLE", &p)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("save on a one-thread pool waits on itself (killed after 30 s)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("saved"), "{out:?}");
}

// ---- A table that never stops the job: growth, admission, expiry, eviction (issue 16) ----

/// A table keeping usage (what expiry and eviction read), admitting after `admit`.
fn managed_cfg(dim: u32, cap: u64, opt: OptimizerKind, admit: u32) -> TableConfig {
    let mut c = cfg(dim, cap, StorageDtype::F32, opt);
    c.track_usage = true;
    c.admit_after = admit;
    c.sketch_bytes = 4 * 4096;
    c
}

fn policy(max_capacity: u64, evict: Evict, expire_after: Option<u64>) -> TablePolicy {
    TablePolicy { max_capacity, evict, expire_after }
}

/// Applies `keys` (one gradient row each, salted by the batch number) under `p`, growing
/// into a file of `dir` named by the table's growths.
fn managed_step(dir: &TempDir, t: &mut EmbeddingTable, keys: &[u64], batch: u64, p: &TablePolicy, ahead: &mut Ahead) -> Managed {
    let next = dir.path(&format!("grown-{}", t.counts().growths + 1));
    apply_managed(t, keys, &grads(keys, t.dim(), batch), 0.5, p, &next, ahead, None).unwrap()
}

/// A key, the bits of its row, its accumulator's bits and its usage.
type KeyRow = (u64, Vec<u32>, Option<u32>, Option<(u32, u32)>);

/// Every key's row, accumulator and usage, by key.
fn contents(t: &EmbeddingTable) -> Vec<KeyRow> {
    t.live_keys().iter().map(|(k, _)| (*k, row(t, *k).iter().map(|x| x.to_bits()).collect(), t.accumulator(*k).map(f32::to_bits), t.usage(*k))).collect()
}

#[test]
fn growth_keeps_every_row_its_state_and_usage() {
    let dir = TempDir::new("emb");
    let mut t = EmbeddingTable::create(&dir.path("t"), &managed_cfg(4, 64, OptimizerKind::Adagrad, 1)).unwrap();
    let keys: Vec<u64> = (0..44).map(|i| i * 1_000_003 + 7).collect();
    t.apply_updates(&keys, &grads(&keys, 4, 1), 0.5).unwrap();
    t.apply_updates(&keys[..10], &grads(&keys[..10], 4, 2), 0.5).unwrap();
    let g = t.grow_into(&dir.path("g"), 256).unwrap();
    assert_eq!((g.capacity(), g.live_rows(), g.generation()), (256, 44, 2));
    assert_eq!(g.counts(), RowCounts { inserted: 44, growths: 1, ..RowCounts::default() });
    assert_eq!(contents(&g), contents(&t), "rows, accumulators and usage move with their keys");
    assert_eq!(g.usage(keys[0]), Some((2, 2)));
    assert_eq!(g.usage(keys[20]), Some((1, 1)));
    // Every key sits where a lookup finds it, and the same update gives the same rows.
    drop(g);
    EmbeddingTable::verify(&dir.path("g")).unwrap();
    let mut g = EmbeddingTable::open_readwrite(&dir.path("g")).unwrap();
    let more: Vec<u64> = (40..50).map(|i| i * 1_000_003 + 7).collect();
    t.apply_updates(&more, &grads(&more, 4, 3), 0.5).unwrap();
    g.apply_updates(&more, &grads(&more, 4, 3), 0.5).unwrap();
    assert_eq!(contents(&g), contents(&t));
    // A growth to a smaller or non-power-of-two capacity is refused.
    assert!(matches!(t.grow_into(&dir.path("x"), 64), Err(TableError::Config(_))));
    assert!(matches!(t.grow_into(&dir.path("x"), 300), Err(TableError::Config(_))));
    assert!(!dir.path("x").exists());
}

#[test]
fn a_managed_table_grows_instead_of_failing_and_ends_as_a_big_one() {
    // 1200 distinct keys through a 16-slot table: it doubles at 70% load, up to 2048 slots.
    // The rows (and accumulators) end the same as in a table big enough from the start.
    let dir = TempDir::new("emb");
    let c = managed_cfg(4, 16, OptimizerKind::Adagrad, 1);
    let mut t = EmbeddingTable::create(&dir.path("small"), &c).unwrap();
    let mut big = EmbeddingTable::create(&dir.path("big"), &managed_cfg(4, 4096, OptimizerKind::Adagrad, 1)).unwrap();
    let p = policy(1 << 20, Evict::Lru, None);
    let mut ahead = Ahead::default();
    let mut grown = Vec::new();
    for b in 0..60u64 {
        // 20 new keys and 10 seen before, in increasing order (as the exchange gives them).
        let mut keys: Vec<u64> = (0..20).map(|i| (b * 20 + i) * 7919 + 1).chain((0..10).map(|i| (b * 7 + i * 3) % (b * 20 + 1) * 7919 + 1)).collect();
        keys.sort_unstable();
        keys.dedup();
        let m = managed_step(&dir, &mut t, &keys, b, &p, &mut ahead);
        if let Some((g, old)) = m.growth {
            assert!(old.header().replaced, "the replaced table is marked for its readers");
            assert_eq!((g.to, t.capacity()), (g.from * 2, g.from * 2));
            grown.push(g.to);
        }
        assert!(t.live_rows() <= t.header().high_water(), "batch {b}: {} rows in {} slots", t.live_rows(), t.capacity());
        big.apply_updates(&keys, &grads(&keys, 4, b), 0.5).unwrap();
    }
    assert_eq!(grown, vec![32, 64, 128, 256, 512, 1024, 2048]);
    assert_eq!(t.counts().growths, 7);
    assert_eq!((t.live_rows(), t.counts().inserted), (1200, 1200));
    assert_eq!(contents(&t), contents(&big), "growth does not change a single row");
}

#[test]
fn admit_after_two_a_key_seen_once_has_no_row_seen_twice_gets_one() {
    let dir = TempDir::new("emb");
    let mut t = EmbeddingTable::create(&dir.path("t"), &managed_cfg(2, 64, OptimizerKind::Sgd, 2)).unwrap();
    assert_eq!(t.inspect().sketch_bytes, 4 * 4096);
    let init = |k: u64| {
        let mut r = vec![0f32; 2];
        t.init_row(k, &mut r);
        r
    };
    let (r1, r2, r3, r4) = (init(1), init(2), init(3), init(4));
    // Batch 1: keys 1, 2, 3 seen once: no rows, their gradients dropped.
    let s = t.apply_updates(&[1, 2, 3], &[1.0; 6], 0.5).unwrap();
    assert_eq!((s.inserted, s.updated, s.refused), (0, 0, 3));
    assert_eq!((t.live_rows(), t.generation()), (0, 1));
    assert_eq!((row(&t, 1), row(&t, 2)), (r1.clone(), r2.clone()), "not admitted: the initial row");
    // Batch 2: keys 2 and 3 seen twice get rows, stepped by this batch's gradient only;
    // key 4 is new (dropped); a key given twice in one batch counts once.
    let s = t.apply_updates(&[2, 3, 4, 4], &[1.0, -1.0, 2.0, 2.0, 9.0, 9.0, 9.0, 9.0], 0.5).unwrap();
    assert_eq!((s.inserted, s.updated, s.refused), (2, 2, 2));
    assert_eq!(row(&t, 2), vec![r2[0] - 0.5, r2[1] + 0.5]);
    assert_eq!(row(&t, 3), vec![r3[0] - 1.0, r3[1] - 1.0]);
    assert_eq!(row(&t, 4), r4, "key 4 seen in one batch only");
    assert!(!t.contains(1) && !t.contains(4));
    // Batch 3: key 4's second batch; key 1's second too.
    let s = t.apply_updates(&[1, 4], &[0.0; 4], 0.5).unwrap();
    assert_eq!((s.inserted, s.refused), (2, 0));
    assert_eq!(t.counts(), RowCounts { inserted: 4, refused: 5, ..RowCounts::default() });
    // The counts live in the file: a saved and loaded copy admits the same.
    t.save(&dir.path("saved")).unwrap();
    let mut l = EmbeddingTable::load(&dir.path("saved"), &dir.path("loaded")).unwrap();
    for u in [&mut t, &mut l] {
        let s = u.apply_updates(&[7, 8], &[0.0; 4], 0.5).unwrap();
        assert_eq!(s.refused, 2);
        let s = u.apply_updates(&[8], &[0.0; 2], 0.5).unwrap();
        assert_eq!(s.inserted, 1);
    }
    assert_eq!(t.as_bytes(), l.as_bytes());
}

#[test]
fn expiry_removes_rows_not_updated_for_s_updates() {
    let dir = TempDir::new("emb");
    let mut t = EmbeddingTable::create(&dir.path("t"), &managed_cfg(2, 64, OptimizerKind::Adagrad, 1)).unwrap();
    let p = policy(64, Evict::Lru, Some(2));
    let mut ahead = Ahead::default();
    // Update 1: keys 1..=5; update 2: key 1; update 3: keys 1, 2.
    let m = managed_step(&dir, &mut t, &[1, 2, 3, 4, 5], 1, &p, &mut ahead);
    assert_eq!(m.expired, 0);
    let m = managed_step(&dir, &mut t, &[1], 2, &p, &mut ahead);
    assert_eq!(m.expired, 0, "keys 2..=5 are 1 update old");
    // After update 3, keys 3, 4, 5 were last updated 2 updates ago: expired.
    let m = managed_step(&dir, &mut t, &[1, 2], 3, &p, &mut ahead);
    assert_eq!(m.expired, 3);
    assert_eq!(t.live_keys().iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!((t.usage(1), t.usage(2)), (Some((3, 3)), Some((3, 2))));
    let mut want = vec![0f32; 2];
    t.init_row(4, &mut want);
    assert_eq!(row(&t, 4), want, "an expired key reads its initial row again");
    assert_eq!(t.counts().expired, 3);
    // Update 4: key 9; update 5: key 2, after which key 1 is 2 updates old (key 9: 1);
    // update 6: key 2 again, and key 9 goes.
    managed_step(&dir, &mut t, &[9], 4, &p, &mut ahead);
    let m = managed_step(&dir, &mut t, &[2], 5, &p, &mut ahead);
    assert_eq!((m.expired, keys_of(&t)), (1, vec![2, 9]));
    let m = managed_step(&dir, &mut t, &[2], 6, &p, &mut ahead);
    assert_eq!((m.expired, keys_of(&t)), (1, vec![2]));
    assert_eq!(t.counts().expired, 5);
    drop(t);
    EmbeddingTable::verify(&dir.path("t")).unwrap();
}

/// The keys of `t`, ascending.
fn keys_of(t: &EmbeddingTable) -> Vec<u64> {
    t.live_keys().iter().map(|(k, _)| *k).collect()
}

#[test]
fn lru_and_lfu_evict_the_right_rows_at_the_largest_size() {
    // 16 slots and no growth: 11 rows fit (0.7); an update that needs more evicts down to
    // 9 (0.6) with its new keys. Keys 1..=11 in update 1; 9, 10, 11 again in updates 2 and
    // 3; 1..=8 in update 4. Then key 12 needs room for 1: 3 rows go.
    //   LRU: the longest since their last update: 9, 10, 11 (update 3).
    //   LFU: the fewest updates (1..=8 have 2, 9..=11 have 3), ties by key: 1, 2, 3.
    let dir = TempDir::new("emb");
    let mut files = Vec::new();
    for (name, evict, gone) in [("lru", Evict::Lru, [9u64, 10, 11]), ("lfu", Evict::Lfu, [1, 2, 3])] {
        for copy in 0..2 {
            let path = dir.path(&format!("{name}{copy}"));
            let mut t = EmbeddingTable::create(&path, &managed_cfg(2, 16, OptimizerKind::Adagrad, 1)).unwrap();
            let p = policy(16, evict, None);
            let mut ahead = Ahead::default();
            for (b, keys) in [(1u64..=11).collect::<Vec<_>>(), vec![9, 10, 11], vec![9, 10, 11], (1..=8).collect()].iter().enumerate() {
                let m = managed_step(&dir, &mut t, keys, b as u64, &p, &mut ahead);
                assert_eq!(m.evicted, 0);
            }
            let m = managed_step(&dir, &mut t, &[12], 5, &p, &mut ahead);
            assert!(m.growth.is_none());
            assert_eq!((m.evicted, m.stats.inserted), (3, 1));
            let want: Vec<u64> = (1..=12).filter(|k| !gone.contains(k)).collect();
            assert_eq!(keys_of(&t), want, "{name}");
            assert_eq!((t.live_rows(), t.counts().evicted), (9, 3));
            for k in gone {
                assert_eq!(t.accumulator(k), None);
            }
            // A batch with more new keys than the table holds: what fits gets rows (after
            // evicting every row it does not touch), the rest is refused — never an error.
            let many: Vec<u64> = (100..120).collect();
            let m = managed_step(&dir, &mut t, &many, 6, &p, &mut ahead);
            assert_eq!((m.evicted, m.stats.inserted, m.stats.refused), (9, 11, 9), "{name}");
            assert_eq!(keys_of(&t), (100..111).collect::<Vec<_>>());
            drop(t);
            EmbeddingTable::verify(&path).unwrap();
            files.push(std::fs::read(&path).unwrap());
        }
    }
    assert!(files[0] == files[1], "the same updates give byte-identical files (LRU)");
    assert!(files[2] == files[3], "the same updates give byte-identical files (LFU)");
}

#[test]
fn eviction_of_a_large_table_takes_exactly_the_policys_first_rows() {
    // 150,000 rows (more than one ranking pass holds, so the histogram passes narrow the
    // threshold down): every row in update 1, then row i again in update g when g divides
    // i. Eviction must take exactly the rows a full sort by the policy's order takes.
    let dir = TempDir::new("emb");
    let mut t = EmbeddingTable::create(&dir.path("t"), &managed_cfg(1, 1 << 18, OptimizerKind::Sgd, 1)).unwrap();
    let keys: Vec<u64> = (0..150_000u64).map(|i| i * 7919 + 1).collect();
    t.apply_updates(&keys, &vec![0.0; keys.len()], 0.1).unwrap();
    for g in 2..=24u64 {
        let some: Vec<u64> = keys.iter().enumerate().filter(|(i, _)| *i as u64 % g == 0).map(|(_, k)| *k).collect();
        t.apply_updates(&some, &vec![0.0; some.len()], 0.1).unwrap();
    }
    t.save(&dir.path("saved")).unwrap();
    let now = t.generation() as u32;
    for (name, evict) in [("lru", Evict::Lru), ("lfu", Evict::Lfu)] {
        let mut u = EmbeddingTable::load(&dir.path("saved"), &dir.path(name)).unwrap();
        // Fewest updates first (LFU only), then the longest since the last update, then
        // the smaller key.
        let mut ranked: Vec<(u32, std::cmp::Reverse<u32>, u64)> = keys
            .iter()
            .map(|k| {
                let (last, n) = u.usage(*k).unwrap();
                (if evict == Evict::Lfu { n } else { 0 }, std::cmp::Reverse(now.wrapping_sub(last)), *k)
            })
            .collect();
        ranked.sort_unstable();
        let n = 70_001;
        assert_eq!(u.evict(n, evict).unwrap(), n);
        let mut want: Vec<u64> = ranked[n as usize..].iter().map(|r| r.2).collect();
        want.sort_unstable();
        assert_eq!(keys_of(&u), want, "{name}");
        drop(u);
        EmbeddingTable::verify(&dir.path(name)).unwrap();
    }
}
