//! Random sequences of every address-space operation (`map`, `unmap`,
//! `unmap_with`, `change_protection`, `move_page_tables`, harvesting,
//! faults, software entries, fork, live changes, gathers; kernel and user
//! spaces) on the simulated machine against a reference model, for the
//! arm64 formats (4 KiB pages with 39-, 48- and 52-bit (LPA2) VA, 16 KiB
//! pages with 36-, 47-, 48- and 52-bit (LPA2) VA, 64 KiB pages with 42-,
//! 48- and 52-bit VA). The engine is `pgtable_testkit::model`, which also
//! describes how to replay a failure and run the soak (`cargo xtask
//! soak`); one test a format, by `pgtable_testkit::model_tests!`.

use pgtable_arm64::{
    Arm64, Arm64K16, Arm64K16Lpa2, Arm64K16Va36, Arm64K16Va47, Arm64K64, Arm64K64Va42,
    Arm64K64Va52, Arm64Lpa2, Arm64Va39,
};

pgtable_testkit::model_tests! {
    model_arm64_48bit_va: Arm64 = "arm64-4K-48bit";
    model_arm64_39bit_va: Arm64Va39 = "arm64-4K-39bit";
    model_arm64_16k_48bit_va: Arm64K16 = "arm64-16K-48bit";
    model_arm64_64k_48bit_va: Arm64K64 = "arm64-64K-48bit";
    model_arm64_4k_52bit_va_lpa2: Arm64Lpa2 = "arm64-4K-52bit-lpa2";
    model_arm64_16k_47bit_va: Arm64K16Va47 = "arm64-16K-47bit";
    model_arm64_16k_36bit_va: Arm64K16Va36 = "arm64-16K-36bit";
    model_arm64_16k_52bit_va_lpa2: Arm64K16Lpa2 = "arm64-16K-52bit-lpa2";
    model_arm64_64k_42bit_va: Arm64K64Va42 = "arm64-64K-42bit";
    model_arm64_64k_52bit_va: Arm64K64Va52 = "arm64-64K-52bit";
}
