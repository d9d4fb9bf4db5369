package org.hydraedge.demo;

import android.content.Context;
import android.content.Intent;
import android.content.IntentFilter;
import android.os.BatteryManager;
import android.os.Build;
import android.os.PowerManager;
import android.os.SystemClock;

import org.json.JSONException;
import org.json.JSONObject;

/**
 * What the phone says about its heat and battery, read the way the app may without permissions:
 * PowerManager's thermal status (API 29+; older phones give none: unknown, which the table reads as
 * the hottest band) and thermal headroom (API 30+; NaN when the phone cannot forecast), and the
 * sticky battery broadcast (level, charging, temperature). The forecast is asked for at most once a
 * second ({@link #HEADROOM_EVERY_MS}): Android answers NaN to a faster caller, so a read in between
 * reuses the last answer and says how old it is.
 */
final class Signals implements Readings {
    /** The state's error for a NaN forecast (a failed read, as a board's `cmd thermalservice headroom` NaN is). */
    static final String HEADROOM_NAN = "getThermalHeadroom(10) answered NaN: the phone cannot forecast now";
    /** PowerManager answers getThermalHeadroom with NaN when asked again within about a second. */
    static final long HEADROOM_EVERY_MS = 1000;
    static final String[] THERMAL_NAMES = {"NONE", "LIGHT", "MODERATE", "SEVERE", "CRITICAL", "EMERGENCY", "SHUTDOWN"};

    /** One reading. {@code null} / NaN: the phone did not say. */
    static final class Reading {
        final long timestampMs;
        final Integer thermalStatus;
        final float thermalHeadroom;
        /** How long before this reading PowerManager gave {@link #thermalHeadroom} (0: asked for this reading). */
        final long headroomAgeMs;
        final Integer batteryPercent;
        final Boolean charging;
        final String batteryStatus;
        /** BatteryManager.BATTERY_STATUS_* as the broadcast gives it (what the switcher library reads), or null. */
        final Integer batteryStatusCode;
        final Float batteryTempC;
        final String thermalError;
        final String batteryError;
        /** Whether the phone was asked for a forecast at all (API 30+): only then is a NaN one a failed read. */
        final boolean readsHeadroom;

        Reading(long timestampMs, Integer thermalStatus, float thermalHeadroom, long headroomAgeMs,
                Integer batteryPercent, Boolean charging, String batteryStatus, Integer batteryStatusCode, Float batteryTempC,
                String thermalError, String batteryError, boolean readsHeadroom) {
            this.timestampMs = timestampMs;
            this.thermalStatus = thermalStatus;
            this.thermalHeadroom = thermalHeadroom;
            this.headroomAgeMs = headroomAgeMs;
            this.batteryPercent = batteryPercent;
            this.charging = charging;
            this.batteryStatus = batteryStatus;
            this.batteryStatusCode = batteryStatusCode;
            this.batteryTempC = batteryTempC;
            this.thermalError = thermalError;
            this.batteryError = batteryError;
            this.readsHeadroom = readsHeadroom;
        }

        String thermalName() {
            if (thermalStatus == null) return null;
            int s = thermalStatus;
            return s >= 0 && s < THERMAL_NAMES.length ? THERMAL_NAMES[s] : String.valueOf(s);
        }

        /** The calibration runner's device state (hydra_edge.runtime.signals.DeviceState.to_dict), same keys. */
        JSONObject toStateJson() throws JSONException {
            JSONObject errors = new JSONObject();
            if (thermalError != null) errors.put("thermal", thermalError);
            if (batteryError != null) errors.put("battery", batteryError);
            if (readsHeadroom && Float.isNaN(thermalHeadroom)) errors.put("headroom", HEADROOM_NAN);
            JSONObject zones = new JSONObject();
            if (batteryTempC != null) zones.put("battery", (double) batteryTempC);
            JSONObject s = new JSONObject();
            s.put("timestamp", timestampMs / 1000.0);
            s.put("thermal_zones", zones);
            s.put("battery_capacity", batteryPercent == null ? JSONObject.NULL : batteryPercent);
            s.put("battery_status", batteryStatus == null ? JSONObject.NULL : batteryStatus);
            s.put("charging", charging == null ? JSONObject.NULL : charging);
            s.put("battery_temp_c", batteryTempC == null ? JSONObject.NULL : (Object) (double) batteryTempC);
            s.put("power_w", JSONObject.NULL);
            s.put("throttling", JSONObject.NULL);
            s.put("android_thermal_status", thermalStatus == null ? JSONObject.NULL : thermalStatus);
            s.put("android_thermal_headroom", Float.isNaN(thermalHeadroom) ? JSONObject.NULL : (Object) (double) thermalHeadroom);
            s.put("tegrastats", JSONObject.NULL);
            s.put("errors", errors);
            s.put("zone_errors", new JSONObject());
            s.put("max_temp_c", batteryTempC == null ? JSONObject.NULL : (Object) (double) batteryTempC);
            s.put("android_thermal_status_name", thermalName() == null ? JSONObject.NULL : thermalName());
            return s;
        }
    }

    /** Whether this phone can forecast its thermal headroom (PowerManager.getThermalHeadroom, API 30+). */
    static boolean readsHeadroom() {
        return Build.VERSION.SDK_INT >= 30;
    }

    /**
     * The last forecast and when it was asked for (SystemClock.elapsedRealtime). Shared by every Signals:
     * they all ask the application context's one PowerManager, whose rate limit is its own.
     */
    private static final Object HEADROOM_LOCK = new Object();
    private static float lastHeadroom = Float.NaN;
    private static long headroomAskedAt = Long.MIN_VALUE;

    private final Context context;

    Signals(Context context) {
        this.context = context.getApplicationContext();
    }

    @Override
    public Reading read() {
        Integer status = null;
        float headroom = Float.NaN;
        long headroomAgeMs = 0;
        String thermalError = null;
        PowerManager pm = (PowerManager) context.getSystemService(Context.POWER_SERVICE);
        if (Build.VERSION.SDK_INT >= 29 && pm != null) {
            status = pm.getCurrentThermalStatus();
            if (readsHeadroom()) {
                synchronized (HEADROOM_LOCK) {
                    long now = SystemClock.elapsedRealtime();
                    if (headroomAskedAt == Long.MIN_VALUE || now - headroomAskedAt >= HEADROOM_EVERY_MS) {
                        lastHeadroom = pm.getThermalHeadroom(10);  // forecast 10 s ahead; NaN when unsupported
                        headroomAskedAt = now;
                    }
                    headroom = lastHeadroom;
                    headroomAgeMs = now - headroomAskedAt;
                }
            }
        } else {
            thermalError = "Android " + Build.VERSION.RELEASE + " (API " + Build.VERSION.SDK_INT
                    + ") has no thermal status; the table's hottest band applies";
        }
        Integer level = null;
        Boolean charging = null;
        String batteryStatus = null;
        Integer statusCode = null;
        Float tempC = null;
        String batteryError = null;
        Intent battery = context.registerReceiver(null, new IntentFilter(Intent.ACTION_BATTERY_CHANGED));
        if (battery == null) {
            batteryError = "no battery broadcast";
        } else {
            int raw = battery.getIntExtra(BatteryManager.EXTRA_LEVEL, -1);
            int scale = battery.getIntExtra(BatteryManager.EXTRA_SCALE, -1);
            if (raw >= 0 && scale > 0 && raw <= scale) {
                level = Math.round(100f * raw / scale);
            } else {
                batteryError = "battery level " + raw + "/" + scale + " is not a percentage";
            }
            int st = battery.getIntExtra(BatteryManager.EXTRA_STATUS, -1);
            if (st >= 0) statusCode = st;
            charging = st == BatteryManager.BATTERY_STATUS_CHARGING || st == BatteryManager.BATTERY_STATUS_FULL;
            batteryStatus = st == BatteryManager.BATTERY_STATUS_CHARGING ? "Charging"
                    : st == BatteryManager.BATTERY_STATUS_FULL ? "Full"
                    : st == BatteryManager.BATTERY_STATUS_DISCHARGING ? "Discharging"
                    : st == BatteryManager.BATTERY_STATUS_NOT_CHARGING ? "Not charging" : "Unknown";
            int tenths = battery.getIntExtra(BatteryManager.EXTRA_TEMPERATURE, Integer.MIN_VALUE);
            if (tenths != Integer.MIN_VALUE) tempC = tenths / 10f;
        }
        return new Reading(System.currentTimeMillis(), status, headroom, headroomAgeMs, level, charging, batteryStatus,
                statusCode, tempC, thermalError, batteryError, readsHeadroom());
    }
}
