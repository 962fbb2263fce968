/* divide.c: correctly rounded __divdf3 and __divsf3 for every guest (built and linked by berm_sdk/runtime.py).
 *
 * zig 0.17's compiler-rt rounds a quotient that lands in the subnormal range twice (to full precision, then again
 * while shifting it into place), so such a quotient can be one unit in the last place off where hardware, and the
 * native build of a harness, is exact. These definitions are strong and linked before compiler-rt, whose own are
 * weak. Integer arithmetic only: a floating-point operation here would call back into these helpers. */

typedef unsigned long u64;
typedef unsigned __int128 u128;

/* The bits of the value nearest to (m + s) * 2^e, where 0 <= s < 1 and s != 0 exactly when `sticky`, in the binary
 * format with frac_bits fraction bits and exp_bits exponent bits; ties to even; `sign` is the sign bit in place.
 * m needs at least frac_bits + 3 significant bits. */
static u64 round_pack(u64 sign, u64 m, int e, int sticky, int frac_bits, int exp_bits) {
    int bias = (1 << (exp_bits - 1)) - 1;
    int top = e + 63 - __builtin_clzl(m);                     /* the exponent of m's leading bit */
    int lsb = (top > 1 - bias ? top : 1 - bias) - frac_bits;  /* the exponent of the result's last bit */
    int shift = lsb - e;                                      /* at least 2 */
    if (shift > 64 - __builtin_clzl(m)) return sign;          /* below half the smallest subnormal */
    u64 q = (u64)((u128)m >> shift);
    u128 rest = (u128)m & (((u128)1 << shift) - 1), half = (u128)1 << (shift - 1);
    q += rest > half || (rest == half && (sticky || (q & 1)));
    /* q carries the implicit bit into the exponent field; a subnormal that rounds up to 2^frac_bits becomes the
     * smallest normal, and a normal that rounds up to 2^(frac_bits+1) moves to the next binade. */
    long base = top + bias - 1 > 0 ? top + bias - 1 : 0;
    u64 bits = ((u64)base << frac_bits) + q, inf = (((u64)1 << exp_bits) - 1) << frac_bits;
    return sign | (bits >= inf ? inf : bits);
}

/* A finite nonzero operand as m * 2^(*exp) with m in [2^frac_bits, 2^(frac_bits+1)). */
static u64 significand(u64 biased, u64 frac, int frac_bits, int bias, int *exp) {
    if (biased) {
        *exp = (int)biased - bias - frac_bits;
        return frac | (u64)1 << frac_bits;
    }
    int shift = __builtin_clzl(frac) - (63 - frac_bits);
    *exp = 1 - bias - frac_bits - shift;
    return frac << shift;
}

static u64 divide(u64 x, u64 y, int frac_bits, int exp_bits) {
    int bias = (1 << (exp_bits - 1)) - 1;
    u64 exp_max = ((u64)1 << exp_bits) - 1, frac_mask = ((u64)1 << frac_bits) - 1;
    u64 sign = (x ^ y) & (u64)1 << (frac_bits + exp_bits);
    u64 ex = x >> frac_bits & exp_max, ey = y >> frac_bits & exp_max, fx = x & frac_mask, fy = y & frac_mask;
    u64 inf = exp_max << frac_bits, nan = inf | (u64)1 << (frac_bits - 1);
    if (ex == exp_max && fx) return x | nan;                   /* a NaN operand, quietened */
    if (ey == exp_max && fy) return y | nan;
    if (ex == exp_max) return ey == exp_max ? nan : sign | inf;
    if (ey == exp_max) return sign;
    if (!(ex | fx)) return ey | fy ? sign : nan;
    if (!(ey | fy)) return sign | inf;
    int kx, ky;
    u64 mx = significand(ex, fx, frac_bits, bias, &kx), my = significand(ey, fy, frac_bits, bias, &ky);
    u128 n = (u128)mx << 62;                                   /* the quotient lies in (2^61, 2^63) */
    u64 q = (u64)(n / my);
    return round_pack(sign, q, kx - ky - 62, n % my != 0, frac_bits, exp_bits);
}

double __divdf3(double a, double b) {
    union { double d; u64 u; } x = {a}, y = {b}, r;
    r.u = divide(x.u, y.u, 52, 11);
    return r.d;
}

float __divsf3(float a, float b) {
    union { float f; unsigned u; } x = {a}, y = {b}, r;
    r.u = (unsigned)divide(x.u, y.u, 23, 8);
    return r.f;
}
