//! More address spaces than PCIDs on the simulator with the x86 formats
//! (non-global leaves are tagged with the PCID of their space), switched
//! by `AsidAllocator::switch_mm`: the run is `pgtable_testkit::asid_switch`.

use pgtable_testkit::{asid_switch, miri_first, miri_scaled};

use asid_switch::check_format;
use pgtable_x86::{X86_64La57, X86_64};

#[test]
fn switch_mm_is_right_on_every_x86_format() {
    check_format::<X86_64>(miri_first(&[1, 2]), miri_scaled(2000)).unwrap();
    check_format::<X86_64La57>(&[3], miri_scaled(2000)).unwrap();
}
