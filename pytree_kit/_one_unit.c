/* _one_unit.c: the C engine's parts built as one compilation unit, so that
 * the compiler sees every call and inlines across the parts (setup.py's
 * default, PYTREE_KIT_C_UNITS=one; it defines PK_ONE_UNIT). Each part also
 * compiles on its own against _core.h, in any order: this file only puts
 * them together.
 */
#include "_core.c"
#include "_fast_type_version_tags.c"
#include "_fast_odict_links.c"
#include "_fast_dict_reads.c"
#include "_fast_dict_tables.c"
#include "_fast_split_values.c"
#include "_memo.c"
#include "_class_plans.c"
#include "_stack.c"
#include "_classify.c"
#include "_mapping_kind.c"
#include "_flatten.c"
#include "_specread.c"
#include "_unflatten.c"
#include "_up_to.c"
#include "_speedups.c"
