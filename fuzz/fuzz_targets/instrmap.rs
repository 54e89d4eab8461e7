//! Any bytes as an ELF file: the image, its instrumentation map and the sled check return
//! values or errors, never panic; what they return is consistent with the bytes.
#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use xray_object::elf::ElfImage;
use xray_object::instrmap::InstrMap;

fuzz_target!(|data: &[u8]| {
    let Ok(image) = ElfImage::from_bytes(PathBuf::from("fuzz"), data.to_vec()) else {
        return;
    };
    let _ = image.build_id();
    let _ = image.entry_file_offset();
    let Ok(map) = InstrMap::from_elf(&image) else {
        return;
    };
    // Ids are 1..=n in order, every sled belongs to the function whose run holds it, and
    // every sled's file offset is inside the file.
    for (i, f) in map.functions.iter().enumerate() {
        assert_eq!(f.id as usize, i + 1);
        assert!(!f.sleds.is_empty());
        for s in &map.sleds[f.sleds.clone()] {
            assert_eq!((s.function_id, s.function_address), (f.id, f.address));
        }
    }
    for s in &map.sleds {
        assert!(s.file_offset < data.len() as u64);
        assert!(image.file_offset(s.address).is_some());
    }
    if map.check_sleds(&image).is_ok() {
        // Checked sleds never share an address.
        let mut addresses: Vec<u64> = map.sleds.iter().map(|s| s.address).collect();
        addresses.sort_unstable();
        assert!(addresses.windows(2).all(|w| w[0] != w[1]));
    }
});
