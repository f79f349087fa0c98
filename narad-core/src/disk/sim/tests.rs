use super::*;

fn disk_with_dir(seed: u64) -> SimDisk {
    let disk = SimDisk::new(seed);
    disk.create_dir_all("d").unwrap();
    disk
}

#[test]
fn synced_data_and_names_survive_a_crash() {
    let disk = disk_with_dir(1);
    disk.create("d/f").unwrap();
    disk.write_at("d/f", 0, b"hello").unwrap();
    disk.sync_data("d/f").unwrap();
    disk.sync_dir("d").unwrap();
    disk.crash();
    assert_eq!(disk.read_at("d/f", 0, 100).unwrap(), b"hello");
}

#[test]
fn unsynced_create_can_vanish() {
    let mut vanished = 0;
    for seed in 0..64 {
        let disk = disk_with_dir(seed);
        disk.create("d/f").unwrap();
        disk.write_at("d/f", 0, b"x").unwrap();
        disk.sync_data("d/f").unwrap();
        disk.crash();
        if disk.len("d/f").is_err() {
            vanished += 1;
        }
    }
    assert!(vanished > 0 && vanished < 64, "vanished {vanished} of 64");
}

#[test]
fn unsynced_appends_tear_to_a_block_prefix() {
    let data: Vec<u8> = (0..5 * BLOCK_BYTES).map(|i| (i % 251) as u8 + 1).collect();
    let mut lengths = BTreeSet::new();
    for seed in 0..200 {
        let disk = disk_with_dir(seed);
        disk.create("d/f").unwrap();
        disk.sync_dir("d").unwrap();
        disk.write_at("d/f", 0, &data).unwrap();
        disk.crash();
        let kept = disk.read_at("d/f", 0, data.len()).unwrap();
        assert_eq!(kept.len() as u64 % BLOCK_BYTES, 0);
        assert_eq!(&data[..kept.len()], &kept[..], "a prefix, never a hole");
        lengths.insert(kept.len());
    }
    assert!(lengths.contains(&0) && lengths.contains(&data.len()) && lengths.len() > 2);
}

#[test]
fn overwrites_of_synced_extent_can_leave_holes() {
    let mut saw_hole = false;
    for seed in 0..100 {
        let disk = disk_with_dir(seed);
        disk.create("d/f").unwrap();
        disk.write_zeros("d/f", 0, 4 * BLOCK_BYTES).unwrap();
        disk.sync_data("d/f").unwrap();
        disk.sync_dir("d").unwrap();
        disk.write_at("d/f", 0, &vec![7u8; 4 * BLOCK_BYTES as usize])
            .unwrap();
        disk.crash();
        let image = disk.read_at("d/f", 0, 4 * BLOCK_BYTES as usize).unwrap();
        let blocks: Vec<bool> = image
            .chunks(BLOCK_BYTES as usize)
            .map(|b| b[0] == 7)
            .collect();
        if blocks.windows(2).any(|w| !w[0] && w[1]) {
            saw_hole = true;
        }
    }
    assert!(
        saw_hole,
        "some seed must persist a later block without an earlier one"
    );
}

#[test]
fn failed_sync_drops_pages_and_a_later_sync_lies() {
    let disk = disk_with_dir(3);
    disk.create("d/f").unwrap();
    disk.sync_dir("d").unwrap();
    disk.write_at("d/f", 0, b"lost").unwrap();
    disk.add_fault(FaultRule {
        path_prefix: "d/".into(),
        kind: DiskFault::SyncEio,
        chance_ppm: 1_000_000,
        remaining: Some(1),
    });
    assert_eq!(disk.sync_data("d/f"), Err(IoFault::Eio));
    assert_eq!(
        disk.read_at("d/f", 0, 4).unwrap(),
        b"lost",
        "still in the page cache"
    );
    assert_eq!(
        disk.sync_data("d/f"),
        Ok(()),
        "fsyncgate: the retry succeeds"
    );
    disk.crash();
    assert_eq!(
        disk.read_at("d/f", 0, 4).unwrap(),
        b"",
        "but the data never reached the disk"
    );
}

#[test]
fn enospc_writes_nothing() {
    let disk = disk_with_dir(4);
    disk.create("d/f").unwrap();
    disk.add_fault(FaultRule {
        path_prefix: String::new(),
        kind: DiskFault::NoSpace,
        chance_ppm: 1_000_000,
        remaining: None,
    });
    assert_eq!(disk.write_at("d/f", 0, b"abc"), Err(IoFault::NoSpace));
    assert_eq!(disk.len("d/f").unwrap(), 0);
    disk.clear_faults();
    assert_eq!(disk.write_at("d/f", 0, b"abc"), Ok(()));
}

#[test]
fn rename_without_dir_sync_can_revert() {
    let mut reverted = 0;
    for seed in 0..64 {
        let disk = disk_with_dir(seed);
        disk.create("d/a").unwrap();
        disk.write_at("d/a", 0, b"x").unwrap();
        disk.sync_data("d/a").unwrap();
        disk.sync_dir("d").unwrap();
        disk.rename("d/a", "d/b").unwrap();
        disk.crash();
        let names = disk.list("d").unwrap();
        assert!(names == ["a"] || names == ["b"], "atomic: {names:?}");
        if names == ["a"] {
            reverted += 1;
        }
    }
    assert!(reverted > 0 && reverted < 64);
}

#[test]
fn bit_rot_changes_synced_bytes() {
    let disk = disk_with_dir(5);
    disk.create("d/f").unwrap();
    disk.write_at("d/f", 0, &[0u8; 8]).unwrap();
    disk.sync_data("d/f").unwrap();
    assert!(disk.rot("d/f", 3, 2));
    assert_eq!(disk.read_at("d/f", 3, 1).unwrap(), [4u8]);
}

#[test]
fn bit_rot_under_an_unsynced_write_hits_the_medium_only_and_the_write_back_covers_it() {
    let disk = disk_with_dir(5);
    disk.create("d/f").unwrap();
    disk.write_at("d/f", 0, &[0u8; 8]).unwrap();
    disk.sync_data("d/f").unwrap();
    disk.sync_dir("d").unwrap();
    disk.write_at("d/f", 2, &[7u8; 2]).unwrap();
    assert!(disk.rot("d/f", 3, 0));
    assert!(disk.rot("d/f", 5, 0));
    assert_eq!(
        disk.read_at("d/f", 0, 8).unwrap(),
        [0, 0, 7, 7, 0, 1, 0, 0],
        "the page in memory is served; the clean byte shows the rot"
    );
    assert_eq!(disk.durable_image("d/f").unwrap(), [0, 0, 0, 1, 0, 1, 0, 0]);
    disk.sync_data("d/f").unwrap();
    assert_eq!(disk.durable_image("d/f").unwrap(), [0, 0, 7, 7, 0, 1, 0, 0]);
}

/// The paged images against flat `Vec` images driven by the same ops and the same crash draws
/// (the model SimDisk had before pages): what reads see, what a sync keeps and what a crash
/// leaves must be byte for byte the same.
mod flat {
    use super::*;

    enum Change {
        Write { offset: u64, data: Vec<u8> },
        Zeros { offset: u64, len: u64 },
        SetLen(u64),
    }

    #[derive(Default)]
    pub struct FlatFile {
        pub live: Vec<u8>,
        durable: Vec<u8>,
        pending: Vec<Change>,
    }

    fn put(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
        let end = offset as usize + data.len();
        if image.len() < end {
            image.resize(end, 0);
        }
        image[offset as usize..end].copy_from_slice(data);
    }

    impl FlatFile {
        pub fn write(&mut self, offset: u64, data: &[u8]) {
            put(&mut self.live, offset, data);
            self.pending.push(Change::Write {
                offset,
                data: data.to_vec(),
            });
        }
        pub fn zeros(&mut self, offset: u64, len: u64) {
            put(&mut self.live, offset, &vec![0; len as usize]);
            self.pending.push(Change::Zeros { offset, len });
        }
        pub fn set_len(&mut self, len: u64) {
            self.live.resize(len as usize, 0);
            self.pending.push(Change::SetLen(len));
        }
        pub fn sync(&mut self) {
            for change in self.pending.drain(..) {
                match change {
                    Change::Write { offset, data } => put(&mut self.durable, offset, &data),
                    Change::Zeros { offset, len } => {
                        put(&mut self.durable, offset, &vec![0; len as usize])
                    }
                    Change::SetLen(len) => self.durable.resize(len as usize, 0),
                }
            }
        }
        pub fn crash(&mut self, rng: &mut ChaCha8Rng) {
            let mut image = std::mem::take(&mut self.durable);
            let mut stopped = false;
            for change in std::mem::take(&mut self.pending) {
                let (offset, data) = match change {
                    Change::SetLen(len) => {
                        if rng.random_bool(0.5) {
                            image.resize(len as usize, 0);
                        }
                        continue;
                    }
                    Change::Write { offset, data } => (offset, data),
                    Change::Zeros { offset, len } => (offset, vec![0; len as usize]),
                };
                let end = offset + data.len() as u64;
                let mut start = offset;
                while start < end {
                    let chunk_end = ((start / BLOCK_BYTES + 1) * BLOCK_BYTES).min(end);
                    let overwrite = chunk_end <= image.len() as u64;
                    let keep = if overwrite {
                        rng.random_bool(0.5)
                    } else if stopped || start > image.len() as u64 {
                        false
                    } else {
                        let keep = rng.random_bool(0.75);
                        stopped |= !keep;
                        keep
                    };
                    if keep {
                        let chunk = &data[(start - offset) as usize..(chunk_end - offset) as usize];
                        put(&mut image, start, chunk);
                    }
                    start = chunk_end;
                }
            }
            self.live = image.clone();
            self.durable = image;
        }
    }
}

fn image_seeds() -> u64 {
    std::env::var("NARAD_SIMDISK_SEEDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(60)
}

#[test]
fn paged_images_read_sync_and_tear_exactly_like_flat_images() {
    let page = PAGE_BYTES as u64;
    for seed in 0..image_seeds() {
        let disk = disk_with_dir(seed);
        disk.create("d/f").unwrap();
        disk.sync_dir("d").unwrap();
        // The disk draws from its own generator only at the crashes here (no fault rules, no
        // pending names): the reference tears with a generator seeded the same.
        let mut crash_rng = ChaCha8Rng::seed_from_u64(seed);
        let mut ops = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
        let mut flat = flat::FlatFile::default();
        let rerun = format!(
            "NARAD_SIMDISK_SEEDS={} cargo test -p narad-core paged_images (seed {seed})",
            seed + 1
        );
        for step in 0..120 {
            let len = flat.live.len() as u64;
            let offset = ops.random_range(0..=len + page);
            match ops.random_range(0..10) {
                0..=3 => {
                    let size = if ops.random_bool(0.2) {
                        2 * page + 300
                    } else {
                        700
                    };
                    let data: Vec<u8> = (0..ops.random_range(0..size))
                        .map(|_| ops.random_range(1..=255))
                        .collect();
                    disk.write_at("d/f", offset, &data).unwrap();
                    flat.write(offset, &data);
                }
                4 => {
                    let zeros = ops.random_range(0..3 * page);
                    disk.write_zeros("d/f", offset, zeros).unwrap();
                    flat.zeros(offset, zeros);
                }
                5 => {
                    let new_len = ops.random_range(0..=len + page);
                    disk.set_len("d/f", new_len).unwrap();
                    flat.set_len(new_len);
                }
                6 | 7 => {
                    disk.sync_data("d/f").unwrap();
                    flat.sync();
                }
                8 => {
                    disk.crash();
                    flat.crash(&mut crash_rng);
                }
                _ => {
                    let want = ops.random_range(0..2 * page as usize);
                    let start = (offset as usize).min(flat.live.len());
                    let end = start.saturating_add(want).min(flat.live.len());
                    let got = disk.read_at("d/f", offset, want).unwrap();
                    assert_eq!(got, flat.live[start..end], "read at step {step}: {rerun}");
                }
            }
            assert_eq!(disk.len("d/f").unwrap(), flat.live.len() as u64, "{rerun}");
        }
        disk.crash();
        flat.crash(&mut crash_rng);
        let image = disk.read_at("d/f", 0, usize::MAX).unwrap();
        assert_eq!(image, flat.live, "after the last crash: {rerun}");
        assert_eq!(disk.durable_image("d/f").unwrap(), flat.live, "{rerun}");
    }
}

#[test]
fn a_truncated_page_reads_zeros_when_the_file_grows_again() {
    let mut image = Image::default();
    image.write(0, &[9u8; 100]);
    image.set_len(10);
    image.set_len(50);
    let mut want = vec![9u8; 10];
    want.resize(50, 0);
    assert_eq!(image.to_vec(), want);
    image.write(PAGE_BYTES as u64 + 5, &[1]);
    assert_eq!(image.len(), PAGE_BYTES + 6);
    assert_eq!(image.read(40, 60), [0u8; 20]);
}

#[test]
fn pages_of_zeros_take_no_memory() {
    let mut image = Image::default();
    image.zero(0, 4 * PAGE_BYTES as u64);
    assert_eq!(image.pages, [None, None, None, None]);
    image.write(PAGE_BYTES as u64 + 1, &[7]);
    image.zero(PAGE_BYTES as u64, PAGE_BYTES as u64);
    assert_eq!(
        image.pages,
        [None, None, None, None],
        "a whole page zeroed is let go"
    );
    image.write(3, &[7, 7]);
    image.zero(4, 1);
    assert_eq!(image.read(0, 6), [0, 0, 0, 7, 0, 0]);
    assert!(image.pages[0].is_some());
}

#[test]
fn a_seed_replays_exactly() {
    let run = |seed| {
        let disk = disk_with_dir(seed);
        disk.create("d/f").unwrap();
        disk.sync_dir("d").unwrap();
        disk.write_at("d/f", 0, &vec![1u8; 10 * BLOCK_BYTES as usize])
            .unwrap();
        disk.crash();
        disk.len("d/f").unwrap()
    };
    for seed in 0..20 {
        assert_eq!(run(seed), run(seed));
    }
}

#[test]
fn a_capacity_refuses_growth_past_it_with_enospc_and_changes_nothing() {
    let disk = disk_with_dir(1);
    let space = |disk: &SimDisk| disk.space().unwrap();
    assert_eq!(
        space(&disk),
        DiskSpace {
            available_bytes: UNBOUNDED_TOTAL_BYTES,
            total_bytes: UNBOUNDED_TOTAL_BYTES
        }
    );
    disk.set_capacity(Some(10_000));
    disk.create("d/a").unwrap();
    disk.write_at("d/a", 0, &[1; 6_000]).unwrap();
    assert_eq!(
        space(&disk),
        DiskSpace {
            available_bytes: 4_000,
            total_bytes: 10_000
        }
    );
    let writes = disk.stats().writes;
    // Past the capacity: ENOSPC, the very fault a full disk's injected rule gives, and no change.
    assert_eq!(
        disk.write_at("d/a", 5_000, &[2; 5_001]),
        Err(IoFault::NoSpace)
    );
    assert_eq!(disk.write_zeros("d/a", 6_000, 4_001), Err(IoFault::NoSpace));
    assert_eq!(disk.set_len("d/a", 10_001), Err(IoFault::NoSpace));
    assert_eq!(disk.stats().writes, writes);
    assert_eq!(disk.len("d/a").unwrap(), 6_000);
    assert_eq!(disk.read_at("d/a", 5_000, 1).unwrap(), [1]);
    // Overwrites need no space; growth up to the capacity exactly is fine.
    disk.write_at("d/a", 0, &[3; 6_000]).unwrap();
    disk.create("d/b").unwrap();
    disk.write_zeros("d/b", 0, 4_000).unwrap();
    assert_eq!(space(&disk).available_bytes, 0);
    assert_eq!(disk.write_at("d/b", 4_000, b"x"), Err(IoFault::NoSpace));
    // Removing, truncating, recreating and renaming over a file give its bytes back.
    disk.set_len("d/b", 1_000).unwrap();
    assert_eq!(disk.used_bytes(), 7_000);
    disk.create("d/b").unwrap();
    assert_eq!(disk.used_bytes(), 6_000);
    disk.write_at("d/b", 0, &[4; 500]).unwrap();
    disk.rename("d/b", "d/a").unwrap();
    assert_eq!(disk.used_bytes(), 500);
    disk.rename("d/a", "d/a").unwrap();
    assert_eq!(disk.used_bytes(), 500);
    disk.remove("d/a").unwrap();
    assert_eq!(space(&disk).available_bytes, 10_000);
    assert_eq!(disk.root_size_bytes(), Ok(0));
    // A capacity below what the files hold refuses growth until enough goes.
    disk.create("d/c").unwrap();
    disk.write_at("d/c", 0, &[5; 3_000]).unwrap();
    disk.set_capacity(Some(2_000));
    assert_eq!(space(&disk).available_bytes, 0);
    assert_eq!(disk.write_at("d/c", 3_000, b"x"), Err(IoFault::NoSpace));
    disk.set_capacity(None);
    disk.write_at("d/c", 3_000, b"x").unwrap();
}

#[test]
fn used_bytes_after_a_crash_are_those_of_the_files_that_survived() {
    for seed in 0..32 {
        let disk = disk_with_dir(seed);
        disk.set_capacity(Some(1 << 20));
        disk.create("d/kept").unwrap();
        disk.write_at("d/kept", 0, &[1; 3 * BLOCK_BYTES as usize])
            .unwrap();
        disk.sync_data("d/kept").unwrap();
        disk.sync_dir("d").unwrap();
        disk.write_at("d/kept", 3 * BLOCK_BYTES, &[2; 2 * BLOCK_BYTES as usize])
            .unwrap();
        disk.create("d/maybe").unwrap();
        disk.write_at("d/maybe", 0, &[3; 100]).unwrap();
        disk.crash();
        let survived: u64 = disk
            .paths()
            .iter()
            .map(|path| disk.len(path).unwrap())
            .sum();
        assert_eq!(disk.used_bytes(), survived, "seed {seed}");
        assert_eq!(
            disk.space().unwrap().available_bytes,
            (1 << 20) - survived,
            "seed {seed}"
        );
    }
}
