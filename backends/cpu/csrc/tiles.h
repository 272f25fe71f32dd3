// Cutting a score matrix (query rows x 16-key groups) into register tiles of compile-time size.
//
// Included inside each kernel translation unit's namespace and target pragma (after <type_traits>),
// so that every instruction set gets its own copy and the tiles inline into it.

template <int N>
using Count = std::integral_constant<int, N>;

// body(Count<R>, Count<G>, r0, g0) for tiles of R rows starting at r0 and G groups (GMAX, then 2, then 1).
template <int R, int GMAX, typename Body>
inline void tiles_of_rows(int r0, int groups, const Body& body) {
  int g0 = 0;
  if constexpr (GMAX >= 4)
    for (; groups - g0 >= 4; g0 += 4) body(Count<R>{}, Count<4>{}, r0, g0);
  if constexpr (GMAX >= 2)
    for (; groups - g0 >= 2; g0 += 2) body(Count<R>{}, Count<2>{}, r0, g0);
  for (; g0 < groups; ++g0) body(Count<R>{}, Count<1>{}, r0, g0);
}

// Covers rows x groups with tiles of at most RMAX (2 or 4) rows and GMAX (1, 2 or 4) groups.
template <int RMAX, int GMAX, typename Body>
inline void for_each_tile(int rows, int groups, const Body& body) {
  static_assert(RMAX == 2 || RMAX == 4, "row tiles of 2 or 4");
  int r0 = 0;
  for (; rows - r0 >= RMAX; r0 += RMAX) tiles_of_rows<RMAX, GMAX>(r0, groups, body);
  const int rest = rows - r0;
  if constexpr (RMAX == 4) {
    if (rest == 3) tiles_of_rows<3, GMAX>(r0, groups, body);
    if (rest == 2) tiles_of_rows<2, GMAX>(r0, groups, body);
  }
  if (rest == 1) tiles_of_rows<1, GMAX>(r0, groups, body);
}
